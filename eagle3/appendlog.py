"""Append-only JSONL files that survive a kill at any instant.

Each row is one `write` of one complete line, flushed at once and fsynced every `fsync_every` rows
and on close. A crash can therefore leave at most a torn last line (no newline, or bytes that do
not parse); `recover` cuts it off before anything is appended, so readers only ever see whole rows.
Rows lost from the page cache by a power cut are simply regenerated, because the file itself is
the only record of what is done.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

from . import owned
from .errors import ConfigError
from .fsio import fsync_dir


def _lines(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, content) of each newline-terminated line."""
    offset = 0
    for number, line in enumerate(data.split(b"\n")[:-1], start=1):
        yield number, offset, line
        offset += len(line) + 1


def recover(path: Path) -> list[dict]:
    """Rows of `path` (empty if it does not exist), after cutting off a torn tail in place.

    A line that does not parse is tolerated only at the end, where a crash leaves it; one in the
    middle means the file was damaged or edited, and resuming on top of it could lose rows."""
    path = Path(path)
    data = owned.read_bytes(path, None, what="append-only log", limit=None)
    if data is None:
        return []
    rows: list[dict] = []
    good_end = 0
    bad: tuple[int, str] | None = None
    for number, offset, line in _lines(data):
        if not line.strip():
            good_end = offset + len(line) + 1 if bad is None else good_end
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            bad = bad or (number, str(e))
            continue
        if bad is not None:
            raise ConfigError(f"{path}:{bad[0]}: not a valid row ({bad[1]}) but later rows are; the file was "
                              f"damaged or edited: repair or delete line {bad[0]}, then rerun")
        rows.append(row)
        good_end = offset + len(line) + 1
    if good_end != len(data):
        with owned.opened(path, os.O_RDWR, what="append-only log") as fd:
            os.ftruncate(fd, good_end)
            os.fsync(fd)
    return rows


def read_rows(path: Path, what: str = "append-only log") -> list[dict]:
    """The whole rows of `path` ([] if it does not exist), without repairing it: for a reader that must
    never write another's file. A line that does not parse (the torn last one of a writer still at
    work) is left out."""
    rows = []
    for line in (owned.read_bytes(path, b"", what=what, limit=None)).split(b"\n"):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class AppendLog:
    def __init__(self, path: Path, fsync_every: int = 16):
        self.path = Path(path)
        self.fsync_every = fsync_every
        self._pending = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fh = os.fdopen(owned.open_own(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what="append-only log"),
                             "ab", buffering=0)
        if created:
            fsync_dir(self.path.parent)  # the new name must survive a crash, not only its data

    def append(self, row: dict) -> None:
        line = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        view = memoryview(line)
        while view:  # unbuffered write may be short (rare; e.g. a signal): finish the same line
            view = view[self._fh.write(view):]
        self._pending += 1
        if self._pending >= self.fsync_every:
            self.sync()

    def sync(self) -> None:
        if self._pending:
            os.fsync(self._fh.fileno())
            self._pending = 0

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> "AppendLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
