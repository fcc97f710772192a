"""Running a coroutine to its end from synchronous code: a phase body or a benchmark window may be called
from a thread that already runs an event loop (an async flow)."""

from __future__ import annotations

import asyncio
import contextvars
import threading


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

    # In the caller's context: what the phase logs from there reaches the caller's run log.
    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,), name="eagle3-phase-loop")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
