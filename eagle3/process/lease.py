"""Leases: at most one run per run dir, and at most one run per GPU of the node.

Every entry point that touches a run dir's services (a pipeline run, a scheduled benchmark, a
single-phase command, `eagle3 handoff`) takes the run dir's lease before anything else; runs
that name GPUs also take one lease per GPU, node-wide. A second run refuses at once (or waits,
if asked) and is told who holds what; it never sweeps, hands off or doctors anything first.

The locks are open-file-description locks (fcntl F_OFD_SETLK): the kernel drops them when the
holder's file is closed, including by `kill -9`, so nothing is ever stuck on a stale PID file, and
F_OFD_GETLK lets `eagle3 status` ask whether a lease is held without taking it. The holder writes
who it is into the lock file (PID, start ticks, command, run dir, GPUs) for the refusal message.

Nothing another user can write decides what is locked or overwritten: the lock dir is never a link
or another non-root user's (`ensure_lock_dir`), each user locks GPU lease files of their own
(created exclusively, never through a link, verified after opening), and another user's lease
file is only ever opened read-only, to see whether it is locked and by whom.

Leases are re-entrant within one process: `eagle3 run` takes them, and the flow it runs in the
same process takes the same leases again without blocking itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import struct
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from . import procfs
from .. import owned
from ..errors import PipelineError
from ..layout import RunLayout

LOCK_DIR_ENV = "EAGLE3_LOCK_DIR"
POLL_S = 0.2
SHARED_LOCK_DIR = Path("/run/lock/eagle3")
FALLBACK_LOCK_DIR = Path("/tmp/eagle3-locks")
MAX_HOLDER_BYTES = 1 << 16


def _shared_lock_dir() -> Path:
    return SHARED_LOCK_DIR if SHARED_LOCK_DIR.parent.is_dir() else FALLBACK_LOCK_DIR


def node_lock_dir() -> Path:
    """Where the node-wide GPU leases live, and which rule picked it:
      - $EAGLE3_LOCK_DIR when set (set it node-wide, not per user: every run must see the same one);
      - as root: /run/lock/eagle3 (tmpfs; /tmp/eagle3-locks without /run/lock), made root-owned 1777
        so every user's runs can lease GPUs there;
      - as another user: that shared directory once root has made it (root-owned, sticky), else a
        per-user /run/lock/eagle3-<uid> (0700): that user's runs then exclude only each other, not
        other users'. `sudo install -d -m 1777 /run/lock/eagle3` (or any root run) makes the shared one."""
    if os.environ.get(LOCK_DIR_ENV):
        return Path(os.environ[LOCK_DIR_ENV])
    shared = _shared_lock_dir()
    if os.geteuid() == 0:
        return shared
    try:
        st = os.lstat(shared)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and st.st_mode & stat.S_ISVTX:
            return shared
    except FileNotFoundError:
        pass
    return shared.with_name(f"{shared.name}-{os.geteuid()}")


def run_lease_path(run_dir: Path) -> Path:
    return RunLayout(Path(run_dir).resolve()).lease


def gpu_lease_path(gpu: int, uid: int | None = None) -> Path:
    """This user's lease file for `gpu`. Each user locks a file of their own (nobody writes through
    another user's file); a GPU is held while any user's file for it is locked."""
    return node_lock_dir() / f"gpu-{int(gpu)}.uid-{os.geteuid() if uid is None else uid}.lease"


class LeaseBusy(PipelineError):
    """Another live run holds the run dir or one of the GPUs."""

    exit_code = 3

    def __init__(self, message: str, holder: dict | None):
        super().__init__(message)
        self.holder = holder


# ---- the node lock dir -------------------------------------------------------------------------

def _lock_dir_problem(path: Path, st: os.stat_result) -> str | None:
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by {owned.user_name(st.st_uid)}, neither root nor you"
    if stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
        return "is writable by others without the sticky bit (anyone could replace a lease file)"
    return None


def ensure_lock_dir() -> Path:
    """The node lock dir, created safely where missing (root: 1777 for every user's runs; others:
    0700, their own) and refused when it is a link, another user's, or writable without the sticky
    bit. An existing directory is never chmod-ed."""
    path = node_lock_dir()
    path.parent.mkdir(parents=True, exist_ok=True)
    shared = os.geteuid() == 0 and not os.environ.get(LOCK_DIR_ENV)
    try:
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False
    if created and shared:  # ours, just made: open it without following, prove it, then open it up
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, 0o1777)
        finally:
            os.close(fd)
    st = os.lstat(path)
    why = _lock_dir_problem(path, st)
    if why:
        raise owned.NotOwned(
            f"GPU lock directory {path} ({owned.describe(st)}) {why}; refused before anything was started or "
            f"stopped. Remove it ({path}) after checking what it is, or point ${LOCK_DIR_ENV} at a directory that is "
            "root's (mode 1777) or yours.")
    return path


# ---- OFD locks ---------------------------------------------------------------------------------

_FLOCK = "hhqqii"  # struct flock on Linux (l_type, l_whence, l_start, l_len, l_pid, padding)


def _flock_struct(kind: int) -> bytes:
    return struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0, 0)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock_struct(fcntl.F_WRLCK))
        return True
    except OSError:  # EAGAIN/EACCES: held by another open file description
        return False


def _unlock(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _flock_struct(fcntl.F_UNLCK))


def _fd_locked(fd: int) -> bool:
    got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock_struct(fcntl.F_WRLCK))
    return struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK


def _open_for_reading(path: Path) -> int | None:
    """A read-only fd on a lease file that is what it claims: a regular file, no link, owned by the
    uid its name gives (or, for the run lease, by the user). None for anything else: it is not a
    lease, it is never written through, and it cannot hold anything."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError:
        return None
    st = os.fstat(fd)
    claimed = _claimed_uid(path)
    if not stat.S_ISREG(st.st_mode) or (st.st_uid != claimed if claimed is not None else
                                        owned.problem(st) is not None):
        os.close(fd)
        return None
    return fd


def _claimed_uid(path: Path) -> int | None:
    tail = Path(path).name.removesuffix(".lease").rpartition(".uid-")[2]
    return int(tail) if ".uid-" in Path(path).name and tail.isdigit() else None


def _holder_from(fd: int) -> dict | None:
    try:
        text = os.pread(fd, MAX_HOLDER_BYTES, 0).decode(errors="replace")
        data = json.loads(text) if text.strip() else None
        return data if isinstance(data, dict) else None
    except (OSError, json.JSONDecodeError):
        return None


def holder_at(path: Path) -> dict | None:
    """Who holds the lease at `path` now (None when it is free), without taking it."""
    fd = _open_for_reading(Path(path))
    if fd is None:
        return None
    try:
        if not _fd_locked(fd):
            return None
        return _holder_from(fd) or {"pid": None, "cmd": "?", "note": "holder has not written its name yet"}
    finally:
        os.close(fd)


def _gpu_files(gpu: int) -> list[Path]:
    try:
        names = os.listdir(node_lock_dir())
    except OSError:
        return []
    return [node_lock_dir() / n for n in sorted(names) if n.startswith(f"gpu-{int(gpu)}.uid-") and n.endswith(".lease")]


def gpu_holder(gpu: int, skip: Path | None = None) -> dict | None:
    """The live run holding `gpu` through any user's lease file, or None."""
    for path in _gpu_files(gpu):
        if path != skip and (h := holder_at(path)) is not None:
            return h
    return None


def lease_holder(run_dir: Path) -> dict | None:
    """The live process holding a run dir's lease, or None."""
    return holder_at(run_lease_path(run_dir))


def gpu_holders(gpus: list[int]) -> dict[int, dict]:
    return {g: h for g in gpus if (h := gpu_holder(g)) is not None}


def describe(holder: dict | None) -> str:
    if not holder:
        return "an unknown process"
    since = f" since {holder['started_at']}" if holder.get("started_at") else ""
    where = f" on run dir {holder['run_dir']}" if holder.get("run_dir") else ""
    host = f" on host {holder['host']}" if holder.get("host") and holder["host"] != socket.gethostname() else ""
    return f"PID {holder.get('pid')} ({holder.get('cmd', '?')}){host}{since}{where}"


# ---- holding -----------------------------------------------------------------------------------

@dataclass
class _Held:
    fd: int
    count: int


_held: dict[str, _Held] = {}


def _me(run_dir: Path, gpus: list[int]) -> dict:
    pid = os.getpid()
    return {"pid": pid, "start_ticks": procfs.start_ticks(pid), "host": socket.gethostname(),
            "cmd": " ".join(procfs.cmdline(pid) or sys.argv)[:300] or "?", "run_dir": str(Path(run_dir).resolve()),
            "gpus": list(gpus), "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def _write_holder(fd: int, holder: dict) -> None:
    data = (json.dumps(holder, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def _acquire(path: Path, me: dict, wait_s: float, what: str, hint: str,
             elsewhere: Callable[[], dict | None] = lambda: None) -> None:
    """Lock the user's own lease file at `path`; `elsewhere()` names a holder of the same thing
    through another user's file. Lock first, look second: of two runs racing for one GPU through
    two users' files, at least one sees the other and backs off."""
    key = str(path)
    if key in _held:
        _held[key].count += 1
        return
    fd = owned.open_own(path, os.O_RDWR | os.O_CREAT, 0o644, what="lease file", root_ok=False)
    deadline = time.monotonic() + max(0.0, wait_s)
    while True:
        holder = None if _try_lock(fd) else (_holder_from(fd) or {"pid": None, "cmd": "?"})
        if holder is None and (holder := elsewhere()) is not None:
            _unlock(fd)
        if holder is None:
            break
        if time.monotonic() >= deadline:
            os.close(fd)
            waited = f" (waited {wait_s:.0f} s)" if wait_s > 0 else ""
            raise LeaseBusy(f"{what} is in use by {describe(holder)}{waited}; nothing was started or stopped. "
                            f"{hint}", holder)
        time.sleep(POLL_S)
    _write_holder(fd, me)
    _held[key] = _Held(fd, 1)


def _release(path: Path) -> None:
    held = _held.get(str(path))
    if held is None:
        return
    held.count -= 1
    if held.count == 0:
        del _held[str(path)]
        with contextlib.suppress(OSError):
            os.ftruncate(held.fd, 0)  # the kernel drops the lock on close; the name goes first
        os.close(held.fd)


@contextlib.contextmanager
def hold(run_dir: Path, gpus: list[int] = (), wait_s: float = 0.0) -> Iterator[dict]:
    """Hold the run dir's lease and the leases of `gpus` (in index order, so two runs waiting for
    overlapping sets cannot deadlock) for the duration of the block. Raises LeaseBusy, or NotOwned
    (before anything is locked) when the run dir or the lock dir is not provably the user's."""
    run_dir = Path(run_dir)
    gpus = sorted(set(gpus))
    me = _me(run_dir, gpus)
    deadline = time.monotonic() + max(0.0, wait_s)
    taken: list[Path] = []
    try:
        path = run_lease_path(run_dir)
        if str(path) not in _held:  # the outermost hold of this run dir in this process proves it
            owned.tighten_umask()
            owned.check_run_dir(run_dir)
        _acquire(path, me, wait_s, f"run dir {me['run_dir']}",
                 "Wait for that run to end (or pass --wait SECONDS), or use another run_dir.")
        taken.append(path)
        if gpus:
            ensure_lock_dir()
        for gpu in gpus:
            path = gpu_lease_path(gpu)
            _acquire(path, me, max(0.0, deadline - time.monotonic()), f"GPU {gpu}",
                     f"Runs on this node must not share GPUs: wait for it (--wait SECONDS) or choose other `gpus`. "
                     f"(GPU leases live in {node_lock_dir()}; ${LOCK_DIR_ENV} moves them.)",
                     elsewhere=lambda gpu=gpu, mine=path: gpu_holder(gpu, skip=mine))
            taken.append(path)
        yield me
    finally:
        for path in reversed(taken):
            _release(path)
