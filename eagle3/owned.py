"""Proof that what the pack acts on is its own.

The pack decides what to signal, skip, delete, overwrite or resume from files: the registry, the
owner token, phase markers, leases, caches, state, progress and handoff reports. Another local
user who could write one of them could steer a run, and most GPU nodes run the pack as root. So
every such file is opened without following symbolic links and checked with fstat: owned by the
invoking user (a node lock dir may also be root's) and not writable by group or others. Anything
else is refused before anything is signalled, removed or written (NotOwned: exit 2), naming the
path, its owner, its mode and the fix. Directories get the same check from lstat.

The run dir is checked as a whole when a run takes it (`check_run_dir`): it, `state/` and every
entry below are the user's, no directory there is writable by anyone else, and no ancestor is
world-writable without the sticky bit (anyone could swap the run dir out from under the run).
From then on only the user (and root) can change anything there; the per-file checks keep
holding where a file is read without that walk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any, Iterator

from .errors import ConfigError

PRIVATE_UMASK = 0o077
MAX_STATE_BYTES = 64 << 20  # a state file larger than this is not one the pack wrote
_MISSING = object()


class NotOwned(ConfigError):
    """A file or directory the pack would act on is not provably the invoking user's."""


def user_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def describe(st: os.stat_result) -> str:
    return f"owner {user_name(st.st_uid)}, mode {stat.filemode(st.st_mode)} ({stat.S_IMODE(st.st_mode):04o})"


def _refuse(path: Path | str, what: str, why: str, st: os.stat_result | None, fix: str) -> NotOwned:
    seen = f" ({describe(st)})" if st is not None else ""
    return NotOwned(f"{what} {path}{seen} {why}; refused before anything was signalled, removed or written. {fix}")


def _foreign_fix(path: Path | str) -> str:
    return (f"Another user made it: remove it ({path}) as its owner or as root, after checking what it is, "
            "or use a run dir of your own.")


def problem(st: os.stat_result, *, root_ok: bool = False) -> tuple[str, str] | None:
    """(why, fix) when `st` is not the invoking user's own, unshared, file or directory."""
    me = os.geteuid()
    if st.st_uid != me and not (root_ok and st.st_uid == 0):
        return f"is owned by {user_name(st.st_uid)}, not by you ({user_name(me)})", ""
    if stat.S_IMODE(st.st_mode) & 0o022 and not stat.S_ISLNK(st.st_mode):
        return "is writable by group or others", "chmod go-w it"
    return None


def check_stat(st: os.stat_result, path: Path | str, what: str, *, root_ok: bool = False) -> None:
    bad = problem(st, root_ok=root_ok)
    if bad:
        why, fix = bad
        raise _refuse(path, what, why, st, f"Fix: chmod go-w {path}." if fix else _foreign_fix(path))


def _link_refusal(path: Path | str, what: str) -> NotOwned:
    st = os.lstat(path)
    return _refuse(path, what, "is a symbolic link, which the pack never follows there", st,
                   f"Remove the link ({path}); if it points where you meant, use the real path instead.")


# ---- files -------------------------------------------------------------------------------------

def open_own(path: Path | str, flags: int = os.O_RDONLY, mode: int = 0o600, what: str = "file",
             root_ok: bool = False) -> int:
    """An fd on `path`, opened without following a link and proven the user's own regular file.
    With O_CREAT a missing file is created exclusively (never through a link planted meanwhile),
    with exactly `mode` whatever the umask."""
    base = flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
    try:
        if flags & os.O_CREAT:
            try:
                fd = os.open(path, base | os.O_EXCL, mode)
                os.fchmod(fd, mode)
            except FileExistsError:
                fd = os.open(path, (base & ~os.O_CREAT) | os.O_NONBLOCK)
        else:
            fd = os.open(path, base | os.O_NONBLOCK)  # a FIFO planted here must not block the open
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _link_refusal(path, what) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, what, "is not a regular file", st, _foreign_fix(path))
        check_stat(st, path, what, root_ok=root_ok)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path | str, default: Any = _MISSING, what: str = "file",
               limit: int | None = MAX_STATE_BYTES) -> Any:
    """The bytes of the user's own file at `path`; `default` when it does not exist. `limit`: None
    for files that grow with the run (append-only logs)."""
    try:
        fd = open_own(path, what=what)
    except FileNotFoundError:
        if default is _MISSING:
            raise
        return default
    with os.fdopen(fd, "rb") as fh:
        data = fh.read() if limit is None else fh.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise _refuse(path, what, f"is over {limit >> 20} MiB, larger than any file the pack writes there", None,
                      _foreign_fix(path))
    return data


def read_json(path: Path | str, default: Any = None, what: str = "state file") -> Any:
    data = read_bytes(path, None, what)
    return default if data is None else json.loads(data)


@contextlib.contextmanager
def opened(path: Path | str, flags: int, mode: int = 0o600, what: str = "file") -> Iterator[int]:
    fd = open_own(path, flags, mode, what)
    try:
        yield fd
    finally:
        os.close(fd)


# ---- directories -------------------------------------------------------------------------------

def check_dir(path: Path | str, what: str = "directory", root_ok: bool = False) -> os.stat_result:
    """lstat `path`: a real directory (no link) of the user's, writable by nobody else."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _link_refusal(path, what)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, what, "is not a directory", st, _foreign_fix(path))
    check_stat(st, path, what, root_ok=root_ok)
    return st


def private_dir(path: Path | str, what: str = "directory") -> Path:
    """`path` as a directory of the user's: created 0700 where missing, and so is its parent (a run
    dir, for its `state/`; further ancestors as the umask allows); checked where it exists."""
    path = Path(path)
    os.makedirs(path.parent, mode=0o700, exist_ok=True)  # the mode applies to the parent, not above it
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_dir(path, what)
    return path


def ancestor_problem(path: Path) -> str | None:
    """Why a directory under `path`'s ancestors could be swapped by anyone: one of them is
    world-writable without the sticky bit. None when none is."""
    for parent in Path(os.path.realpath(path)).parents:
        try:
            st = os.stat(parent)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o002 and not mode & stat.S_ISVTX:
            return (f"its parent directory {parent} is writable by every user without the sticky bit "
                    f"({describe(st)}), so anyone can rename or replace what is in it: "
                    f"`chmod +t {parent}` (or o-w), or choose a run dir elsewhere")
    return None


def owner_problem(path: Path) -> str | None:
    """Why an existing run dir at `path` is not the user's (owned by another user, or writable by
    group or others); None when it is, or does not exist yet."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    bad = problem(st)
    if bad is None:
        return None
    why, fix = bad
    return (f"it {why} ({describe(st)}), so another user could steer the run through it: " +
            (f"`chmod go-w {path}`" if fix else "give each user a run dir of their own"))


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    todo = [str(root)]
    while todo:
        top = todo.pop()
        with os.scandir(top) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=False)
                yield entry.path, st
                if stat.S_ISDIR(st.st_mode):
                    todo.append(entry.path)


def check_run_dir(run_dir: Path | str) -> Path:
    """Prove the run dir is the user's before a run acts on anything in it, creating it (0700)
    and its `state/` where missing. Raises NotOwned naming the first entry that is not."""
    given = Path(run_dir)
    if os.path.islink(given):
        check_stat(os.lstat(given), given, "run dir link", root_ok=True)
    real = Path(os.path.realpath(given))
    why = ancestor_problem(real)
    if why:
        raise NotOwned(f"run dir {real}: {why}; refused before anything was signalled, removed or written.")
    private_dir(real, "run dir")
    private_dir(real / "state", "run dir's state directory")
    for path, st in _walk(real):
        what = "directory in the run dir" if stat.S_ISDIR(st.st_mode) else "file in the run dir"
        check_stat(st, path, what)
    return real


def tighten_umask() -> int:
    """From here on this process creates files and directories readable by the user alone (the
    children it starts inherit it). Returns the previous umask."""
    old = os.umask(PRIVATE_UMASK)
    os.umask(old | PRIVATE_UMASK)
    return old
