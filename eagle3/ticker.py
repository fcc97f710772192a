"""The one background poller the pack's watchers share (the training-log follower, the online
hidden-state cache guard, the extraction progress counter, the progress heartbeat)."""
from __future__ import annotations

import threading


class Ticker:
    """Calls tick() every `every_s` seconds on a daemon thread while used as a context manager;
    on exit stops the thread, then calls last_tick() (tick() unless overridden) so that what
    changed after the last tick is not missed."""

    def __init__(self, every_s: float, name: str, join_timeout_s: float | None = None):
        self.every_s = every_s
        self._join_timeout_s = join_timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def last_tick(self) -> None:
        self.tick()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.tick()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._join_timeout_s)
        self.last_tick()
