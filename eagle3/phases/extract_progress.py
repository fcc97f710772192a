"""The extract phase's progress while the client writes hidden-state files."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from ..progress import PhaseProgress
from ..ticker import Ticker
from .hs_files import HS_NAME


class HsFileProgress(Ticker):
    """Counts finished hs files while the client runs (a listdir per second) and reports them with
    the bytes they hold (each file is stat'ed once: it appears complete, by rename) and the free
    space left on their filesystem: on entry, on every change, and once more on exit."""

    def __init__(self, directory: Path, total: int, fn: PhaseProgress, expected_bytes: int | None = None):
        super().__init__(1.0, name="extract-progress")
        self.directory, self.total, self.fn, self.expected = directory, total, fn, expected_bytes
        self._sizes: dict[str, int] = {}
        self._bytes = 0
        self._last = -1

    def count(self) -> int:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        done = [n for n in names if (m := HS_NAME.match(n)) and int(m.group(1)) < self.total]
        for name in done:
            if name not in self._sizes:
                with contextlib.suppress(OSError):
                    self._sizes[name] = (self.directory / name).stat().st_size
                    self._bytes += self._sizes[name]
        return len(done)

    def _report(self, done: int) -> None:
        try:
            free = shutil.disk_usage(self.directory).free
        except OSError:
            free = None
        self.fn(done, self.total, bytes_written=self._bytes, bytes_expected=self.expected, disk_free=free)

    def tick(self) -> None:
        done = self.count()
        if done != self._last:
            self._report(done)
            self._last = done

    def last_tick(self) -> None:
        self._report(self.count())

    def __enter__(self):
        self._report(self.count())
        return super().__enter__()
