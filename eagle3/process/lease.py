"""Leases: at most one run per run dir, and at most one run per GPU of the node.

Every entry point that touches a run dir's services (a pipeline run, a scheduled benchmark, a
single-phase command, `eagle3 handoff`) takes the run dir's lease before anything else; runs
that name GPUs also take one lease per GPU, node-wide. A second run refuses at once (or waits,
if asked) and is told who holds what; it never sweeps, hands off or doctors anything first.

The locks are open-file-description locks (fcntl F_OFD_SETLK): the kernel drops them when the
holder's file is closed, including by `kill -9`, so nothing is ever stuck on a stale PID file, and
F_OFD_GETLK lets `eagle3 status` ask whether a lease is held without taking it. The holder writes
who it is into the lock file (PID, start ticks, command, run dir, GPUs) for the refusal message.

Leases are re-entrant within one process: `eagle3 run` takes them, and the flow it runs in the
same process takes the same leases again without blocking itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from . import procfs
from ..errors import PipelineError
from ..layout import RunLayout

LOCK_DIR_ENV = "EAGLE3_LOCK_DIR"
POLL_S = 0.2


def node_lock_dir() -> Path:
    """Where the node-wide GPU leases live: $EAGLE3_LOCK_DIR, else /run/lock/eagle3 (tmpfs, shared
    by every user of the node), else /tmp/eagle3-locks on systems without /run/lock. Every run on a
    node must see the same directory, so set EAGLE3_LOCK_DIR node-wide (not per user) if you change it."""
    if os.environ.get(LOCK_DIR_ENV):
        return Path(os.environ[LOCK_DIR_ENV])
    return Path("/run/lock/eagle3") if Path("/run/lock").is_dir() else Path("/tmp/eagle3-locks")


def run_lease_path(run_dir: Path) -> Path:
    return RunLayout(Path(run_dir).resolve()).lease


def gpu_lease_path(gpu: int) -> Path:
    return node_lock_dir() / f"gpu-{int(gpu)}.lease"


class LeaseBusy(PipelineError):
    """Another live run holds the run dir or one of the GPUs."""

    exit_code = 3

    def __init__(self, message: str, holder: dict | None):
        super().__init__(message)
        self.holder = holder


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


def _is_locked(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _flock_struct(fcntl.F_WRLCK))
        return struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK
    finally:
        os.close(fd)


def _open_lock_file(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent == node_lock_dir():
        with contextlib.suppress(PermissionError):  # another user's run must be able to lock here too
            os.chmod(path.parent, 0o1777)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(PermissionError):
        os.fchmod(fd, 0o666)
    return fd


def _read_holder(path: Path) -> dict | None:
    try:
        text = Path(path).read_text()
        return json.loads(text) if text.strip() else None
    except (FileNotFoundError, PermissionError, json.JSONDecodeError):
        return None


def _write_holder(fd: int, holder: dict) -> None:
    data = (json.dumps(holder, sort_keys=True) + "\n").encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)
    os.fsync(fd)


def holder_at(path: Path) -> dict | None:
    """Who holds the lease at `path` now (None when it is free), without taking it."""
    if not _is_locked(Path(path)):
        return None
    return _read_holder(path) or {"pid": None, "cmd": "?", "note": "holder has not written its name yet"}


def lease_holder(run_dir: Path) -> dict | None:
    """The live process holding a run dir's lease, or None."""
    return holder_at(run_lease_path(run_dir))


def gpu_holders(gpus: list[int]) -> dict[int, dict]:
    return {g: h for g in gpus if (h := holder_at(gpu_lease_path(g))) is not None}


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


def _acquire(path: Path, me: dict, wait_s: float, what: str, hint: str) -> None:
    key = str(path)
    if key in _held:
        _held[key].count += 1
        return
    fd = _open_lock_file(path)
    deadline = time.monotonic() + max(0.0, wait_s)
    while not _try_lock(fd):
        if time.monotonic() >= deadline:
            os.close(fd)
            holder = _read_holder(path)
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
    overlapping sets cannot deadlock) for the duration of the block. Raises LeaseBusy."""
    run_dir = Path(run_dir)
    gpus = sorted(set(gpus))
    me = _me(run_dir, gpus)
    deadline = time.monotonic() + max(0.0, wait_s)
    taken: list[Path] = []
    try:
        path = run_lease_path(run_dir)
        _acquire(path, me, wait_s, f"run dir {me['run_dir']}",
                 "Wait for that run to end (or pass --wait SECONDS), or use another run_dir.")
        taken.append(path)
        for gpu in gpus:
            path = gpu_lease_path(gpu)
            _acquire(path, me, max(0.0, deadline - time.monotonic()), f"GPU {gpu}",
                     f"Runs on this node must not share GPUs: wait for it (--wait SECONDS) or choose other `gpus`. "
                     f"(GPU leases live in {node_lock_dir()}; ${LOCK_DIR_ENV} moves them.)")
            taken.append(path)
        yield me
    finally:
        for path in reversed(taken):
            _release(path)
