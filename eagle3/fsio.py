"""Durable file writes: nothing the pack writes is ever seen half-written."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from . import owned


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: Path, default: Any = None) -> Any:
    """A JSON file the pack wrote and now acts on: refused (owned.NotOwned) unless it is the user's own
    regular file, not a link, not writable by others. `default` when it does not exist."""
    return owned.read_json(path, default)


def read_input_json(path: Path, default: Any = None) -> Any:
    """A JSON file the pack only reads for information (e.g. beside a drafter another user trained)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return default


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: Path, blocking: bool = True) -> Iterator[None]:
    """Exclusive advisory lock; released by the kernel if the holder dies.
    With blocking=False a held lock raises BlockingIOError at once instead of waiting."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with owned.opened(path, os.O_RDWR | os.O_CREAT, what="lock file") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def tail(path: Path, max_bytes: int = 4000) -> str:
    """Last bytes of a log, decoded leniently (logs may hold partial UTF-8)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def link_or_copy(src: Path, dst: Path) -> None:
    """dst becomes another name of src (a copy where the filesystem refuses hard links), replaced
    atomically: a reader sees the old dst or the new one."""
    dst = Path(dst)
    tmp = dst.with_name(f".{dst.name}.linking")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copy2(src, tmp)
    os.replace(tmp, dst)


def swap_in_dir(staged: Path, out_dir: Path, scratch: Path) -> None:
    """Put a fully built `staged` dir at `out_dir` by rename; an old `out_dir` moves into `scratch`
    (which the caller deletes), so readers see the old tree or the new one, never a mix."""
    if out_dir.exists():
        os.rename(out_dir, Path(scratch) / "previous")
    os.rename(staged, out_dir)
    fsync_dir(Path(out_dir).parent)
