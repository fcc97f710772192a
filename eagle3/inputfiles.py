"""Files named by a user (a config, a prompt set, a model's config.json): checked for what they are
before anything opens them, and read with a size cap, so that a FIFO, a device such as /dev/zero,
a directory or a symlink loop is a clear error instead of a hang, an endless read or a traceback.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import ConfigError

MAX_JSON_BYTES = 16 << 20  # a model's or drafter's config.json is a few KB

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _stat(path: Path) -> tuple[os.stat_result | None, str | None]:
    try:
        return os.stat(path), None
    except FileNotFoundError:
        return None, "does not exist"
    except NotADirectoryError:
        return None, "does not exist (a component of the path is a file, not a directory)"
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, "is a symlink loop"
        if e.errno == errno.ENAMETOOLONG:
            return None, "is too long a path"
        return None, f"cannot be accessed ({e.strerror})"
    except ValueError:  # an embedded NUL byte
        return None, "is not a valid path"


def _kind(st: os.stat_result) -> str:
    return next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")


def file_problem(path: Path | str) -> str | None:
    """Why `path` is not a regular, readable file (symlinks followed), or None if it is one."""
    st, why = _stat(Path(path))
    if why:
        return why
    if not stat.S_ISREG(st.st_mode):
        return f"is {_kind(st)}, not a regular file"
    if not os.access(path, os.R_OK):
        return "is not readable (permission denied)"
    return None


def dir_problem(path: Path | str) -> str | None:
    """Why `path` is not a searchable directory (symlinks followed), or None if it is one."""
    st, why = _stat(Path(path))
    if why:
        return why
    if not stat.S_ISDIR(st.st_mode):
        return f"is {'a regular file' if stat.S_ISREG(st.st_mode) else _kind(st)}, not a directory"
    if not os.access(path, os.R_OK | os.X_OK):
        return "is not readable (permission denied)"
    return None


def read_capped(path: Path | str, max_bytes: int, what: str) -> bytes:
    """The bytes of a regular file of at most `max_bytes`; ConfigError starting with `what` (the
    field or file the message names) otherwise. The file is checked before it is opened and again
    on the open descriptor (O_NONBLOCK: a FIFO swapped in between cannot block the open)."""
    path = Path(path)
    why = file_problem(path)
    if why:
        raise ConfigError(f"{what}: {str(path)!r} {why}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{what}: cannot open {str(path)!r} ({e.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what}: {str(path)!r} is {_kind(st)}, not a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(f"{what}: {str(path)!r} is {st.st_size} bytes, more than the {max_bytes} bytes allowed")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew while being read
        raise ConfigError(f"{what}: {str(path)!r} is more than the {max_bytes} bytes allowed")
    return data


def decode_utf8(data: bytes, what: str) -> str:
    """Strict UTF-8 (a leading BOM is dropped); the error names the line and byte offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{what}: not UTF-8 text: byte {data[e.start]:#04x} at offset {e.start} (line {line}) "
                          "cannot be decoded; save the file as UTF-8") from None
