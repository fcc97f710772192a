"""The pipeline's phases, each a plain function over the config (no orchestrator imports here)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from pathlib import Path
from typing import Iterator

from ..errors import PipelineError
from ..fsio import file_lock
from ..progress import ProgressFn  # noqa: F401 - re-exported: what a phase's on_progress is


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


def run_coroutine(coro) -> None:
    """asyncio.run, also from a thread that already runs an event loop (e.g. an async flow)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, BaseException] = {}

    def target() -> None:
        try:
            asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="eagle3-phase-loop")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
