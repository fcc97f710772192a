"""The directories the pack builds whole: a real or tiny model, a test drafter, an installed drafter.

Each is built in a scratch dir beside its place (the same filesystem, so the last rename is atomic),
checked, then renamed in: a reader sees the old dir or the new one, never a half-written one, and a
failed build leaves the old one as it was. Builders of one dir serialise on a lock beside it (parallel
test sessions build it once), and a dir that is still current is kept.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .config import EngineEnv
from .errors import ConfigError, GateError
from .fsio import file_lock, swap_in_dir
from .process.services import LaunchSpec, Supervisor


def ensure_built(out_dir: Path, is_current: Callable[[Path], bool], build: Callable[[Path], object],
                 force: bool = False) -> tuple[Path, bool]:
    """(`out_dir` resolved, built now?): `build(out_dir)` unless `is_current(out_dir)`, under the dir's lock."""
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out_dir.parent / f".{out_dir.name}.lock"):
        if not force and is_current(out_dir):
            return out_dir, False
        build(out_dir)
        return out_dir, True


@contextlib.contextmanager
def building(out_dir: Path, kind: str = "build") -> Iterator[tuple[Path, Path]]:
    """(staged, work): build into `staged`; when the block ends without an error, `staged` replaces
    `out_dir` by rename. The scratch dir `work` (`.NAME.KIND-XXXXXXXX` beside `out_dir`) always goes."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    work = out_dir.parent / f".{out_dir.name}.{kind}-{uuid.uuid4().hex[:8]}"
    staged = work / "built"
    try:
        work.mkdir()
        yield staged, work
        swap_in_dir(staged, out_dir, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_engine_builder(name: str, engine: EngineEnv, script: Path, args: Sequence[str], work: Path, staged: Path,
                       required: Sequence[str], timeout_s: float) -> Path:
    """One of the engine-side builders (eagle3/engine_side/), supervised, writing into `staged`; every
    file of `required` must be there after it. Returns its log."""
    if engine.python is not None and not os.access(engine.python, os.X_OK):
        raise ConfigError(f"engine interpreter {str(engine.python)!r} is not executable; build the engine venv "
                          "with scripts/setup-engine-env.sh or pass --engine-python")
    log = work / "build.log"
    Supervisor(work / "state").run(LaunchSpec(name=name, phase="setup", log=log, env=dict(engine.env),
                                              stop_grace_s=5.0, argv=[*engine.python_argv(), str(script), *args]),
                                   timeout_s=timeout_s)
    missing = [f for f in required if not (staged / f).is_file()]
    if missing:
        raise GateError(f"{name}: the builder exited 0 but did not write {missing}; see {log}")
    return log
