"""Ending single processes that were proven ours, without ever signalling a reused PID.

Each target is pinned with a pidfd first and its start time re-checked through /proc after the
pidfd exists: from then on the signal can only reach that very process, even if it exits and the
PID is handed out again. Then SIGTERM, a polled grace period, SIGKILL, and a wait for the exit.
"""

from __future__ import annotations

import os
import select
import signal
import time
from dataclasses import dataclass

from . import procfs

KILL_WAIT_S = 10.0  # after SIGKILL: a big CUDA context is torn down in seconds, not minutes


@dataclass
class Ended:
    pid: int
    cmd: str
    reason: str
    signal: str  # "SIGTERM", "SIGKILL", "none" (gone before), "skipped" (PID reused)
    outcome: str  # "exited", "survived SIGKILL", "not ours any more"
    seconds: float
    state: str = ""  # for a survivor of SIGKILL: its kernel state and wait channel (why it cannot exit)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _exited(pidfd: int, pid: int) -> bool:
    # A pidfd polls readable once the process has exited (a zombie counts: it holds no GPU).
    ready = select.select([pidfd], [], [], 0)[0]
    return bool(ready) or not procfs.alive(pid)


def end_processes(targets: list[tuple[int, int | None, str, str]], grace_s: float,
                  poll_s: float = 0.05) -> list[Ended]:
    """targets: (pid, start_ticks seen when classified, command line, why it is ours)."""
    t0 = time.monotonic()
    pinned: list[tuple[int, int, str, str]] = []
    results: list[Ended] = []
    for pid, ticks, cmd, why in targets:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            results.append(Ended(pid, cmd, why, "none", "exited", 0.0))
            continue
        if ticks is None or procfs.start_ticks(pid) != ticks:
            os.close(fd)
            results.append(Ended(pid, cmd, why, "skipped", "not ours any more", 0.0))
            continue
        pinned.append((fd, pid, cmd, why))
    try:
        used = _signal_all(pinned, signal.SIGTERM)
        _wait(pinned, grace_s, poll_s)
        survivors = [p for p in pinned if not _exited(p[0], p[1])]
        killed = _signal_all(survivors, signal.SIGKILL)
        _wait(survivors, KILL_WAIT_S, poll_s)
        elapsed = round(time.monotonic() - t0, 3)
        for fd, pid, cmd, why in pinned:
            sig = "SIGKILL" if pid in killed else ("SIGTERM" if pid in used else "none")
            stuck = None if _exited(fd, pid) else procfs.task_state(pid)
            outcome = "survived SIGKILL" if stuck else "exited"
            results.append(Ended(pid, cmd, why, sig, outcome, elapsed, stuck.describe() if stuck else ""))
    finally:
        for fd, *_ in pinned:
            os.close(fd)
    return results


def _signal_all(pinned, sig: int) -> set[int]:
    sent = set()
    for fd, pid, *_ in pinned:
        try:
            signal.pidfd_send_signal(fd, sig)
            sent.add(pid)
        except ProcessLookupError:
            pass
    return sent


def _wait(pinned, timeout_s: float, poll_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(not _exited(fd, pid) for fd, pid, *_ in pinned) and time.monotonic() < deadline:
        time.sleep(poll_s)
