"""The one background poller the pack's watchers share (the training-log follower, the online
hidden-state cache guard, the extraction progress counter, the progress heartbeat)."""
from __future__ import annotations

import contextvars
import threading


class Ticker:
    """Calls tick() every `every_s` seconds on a daemon thread while used as a context manager;
    on exit stops the thread, then calls last_tick() (tick() unless overridden) so that what
    changed after the last tick is not missed. The thread runs in a copy of the context it was
    started from: what a tick logs reaches the same handlers as the caller's records would (an
    orchestrator's run context, its settings), not a context of nothing."""

    def __init__(self, every_s: float, name: str, join_timeout_s: float | None = None):
        self.every_s = every_s
        self._join_timeout_s = join_timeout_s
        self._stop = threading.Event()
        self._name = name
        self._thread: threading.Thread | None = None

    def tick(self) -> None:
        raise NotImplementedError

    def last_tick(self) -> None:
        self.tick()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def __enter__(self):
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._loop,), name=self._name, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(self._join_timeout_s)
        self.last_tick()
