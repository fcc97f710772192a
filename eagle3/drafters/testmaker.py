"""Test drafters: an untrained (random) or a constant EAGLE-format EAGLE-3 drafter for a target.

They exist to prove the benchmark's measurement, not to be good: the untrained one must give
acceptance near 0, and the constant one (with the constant tiny target) exactly 100 %. The
weights come from eagle3/engine_side/make_eagle3_drafter.py, run with the engine's interpreter
as a supervised one-shot command, built in a scratch dir and renamed into place (never seen
half-written), with a stamp so a changed builder or target triggers a rebuild.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import EngineEnv
from ..errors import ConfigError
from ..built_dir import building, ensure_built, run_engine_builder
from ..fsio import atomic_write_json, read_json

BUILDER = Path(__file__).resolve().parent.parent / "engine_side" / "make_eagle3_drafter.py"
STAMP = "eagle3-test-drafter.json"
REQUIRED_FILES = ("config.json", "model.safetensors")


@dataclass(frozen=True)
class DrafterSpec:
    constant: bool = False
    aux_layer_ids: tuple[int, ...] | None = None  # layer-input convention; None: the builder's default
    draft_vocab: int | None = None
    seed: int = 0

    def argv(self) -> list[str]:
        argv = ["--seed", str(self.seed)]
        if self.constant:
            argv.append("--constant")
        if self.aux_layer_ids:
            argv += ["--aux-layer-ids", *map(str, self.aux_layer_ids)]
        if self.draft_vocab:
            argv += ["--draft-vocab", str(self.draft_vocab)]
        return argv


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def expected_stamp(target: Path, spec: DrafterSpec) -> dict:
    return {"builder": "eagle3.drafters.testmaker", "spec": asdict(spec), "builder_sha256": _sha256(BUILDER),
            "target": str(Path(target).resolve()), "target_config_sha256": _sha256(Path(target) / "config.json")}


def is_current(path: Path, target: Path, spec: DrafterSpec) -> bool:
    path = Path(path)
    return all((path / f).is_file() for f in REQUIRED_FILES) and read_json(path / STAMP) == expected_stamp(target, spec)


def make_drafter(out_dir: Path, target: Path, engine: EngineEnv, spec: DrafterSpec = DrafterSpec(),
                 timeout_s: float = 300.0) -> Path:
    out_dir, target = Path(out_dir).resolve(), Path(target).resolve()
    if not (target / "config.json").is_file():
        raise ConfigError(f"target {str(target)!r} has no config.json; build it first (eagle3 make-tiny-model)")
    with building(out_dir) as (staged, work):
        run_engine_builder("make-test-drafter", engine, BUILDER, ["--target", str(target), "--out", str(staged),
                                                                  *spec.argv()], work, staged, REQUIRED_FILES, timeout_s)
        atomic_write_json(staged / STAMP, expected_stamp(target, spec))
    return out_dir


def ensure_drafter(path: Path, target: Path, engine: EngineEnv, spec: DrafterSpec = DrafterSpec(),
                   force: bool = False) -> Path:
    """Return `path`, building the drafter first if missing or built differently."""
    return ensure_built(path, lambda p: is_current(p, target, spec),
                        lambda p: make_drafter(p, target, engine, spec), force)[0]


def drafter_aux_ids(path: Path) -> list[int] | None:
    """The aux-layer ids a drafter's config.json declares (top level or eagle_config), if any."""
    try:
        raw = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    ids = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    return list(ids) if isinstance(ids, list) else None
