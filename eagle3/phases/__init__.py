"""The pipeline's phases, each a plain function over the config (no orchestrator imports here)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

from ..errors import PipelineError
from ..fsio import file_lock

ProgressFn = Callable[[int, int], None]


class RunDirBusy(PipelineError):
    """Another process is running this phase on the same run dir."""


@contextlib.contextmanager
def exclusive_phase_dir(lock: Path, who: str) -> Iterator[None]:
    """Hold the phase dir's lock for the whole body. Only a failure to *take* the lock becomes
    RunDirBusy; a BlockingIOError raised later by the body itself stays what it is."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(lock, blocking=False))
        except BlockingIOError:
            raise RunDirBusy(f"{Path(lock).parent}: another {who} is running on this run dir; "
                             "wait for it to finish or stop it, then rerun") from None
        yield
