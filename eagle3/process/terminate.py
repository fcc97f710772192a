"""The one way the pack ends processes: `escalate` (SIGTERM, a polled grace period, SIGKILL, a wait
for the exit, and the kernel's word on any survivor). A service's process group (eagle3.process.services
.stop_entry) and single processes proven ours (`end_processes`, used by the handoff) both go through it;
only how the signal is delivered differs.

`end_processes` never signals a reused PID: each target is pinned with a pidfd first and its start
time re-checked through /proc after the pidfd exists, so from then on the signal can only reach that
very process, even if it exits and the PID is handed out again.
"""

from __future__ import annotations

import os
import select
import signal
import time
from dataclasses import dataclass
from typing import Callable

from . import procfs

KILL_WAIT_S = 10.0  # after SIGKILL: a big CUDA context is torn down in seconds, not minutes
POLL_S = 0.05


@dataclass
class Escalation:
    signal: str  # the last signal sent: "SIGTERM" or "SIGKILL"
    killed: list[int]  # still there when the grace ran out: sent SIGKILL
    survivors: list[int]  # still there after SIGKILL (a kernel wait SIGKILL cannot interrupt)


def escalate(send: Callable[[int], None], remaining: Callable[[], list[int]], grace_s: float,
             poll_s: float = POLL_S, kill: bool = True) -> Escalation:
    """SIGTERM to what `send` reaches, up to `grace_s` for `remaining()` to empty, then SIGKILL and
    up to KILL_WAIT_S more (SIGKILL only marks a task; its memory is released as it exits).
    `kill=False`: no SIGKILL; what is left is returned as `killed` for the caller's next step."""
    send(signal.SIGTERM)
    left = _wait_for(remaining, grace_s, poll_s)
    if not left:
        return Escalation("SIGTERM", [], [])
    if not kill:
        return Escalation("SIGTERM", left, left)
    send(signal.SIGKILL)
    return Escalation("SIGKILL", left, _wait_for(remaining, KILL_WAIT_S, poll_s))


def _wait_for(remaining: Callable[[], list[int]], seconds: float, poll_s: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := remaining()) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return left


def stuck(pids: list[int]) -> list[dict]:
    """Why each survivor of SIGKILL is still there, as the kernel says (state D: inside a driver or
    I/O call that SIGKILL cannot interrupt)."""
    out = []
    for pid in pids:
        state, info = procfs.task_state(pid), procfs.read_stat(pid)
        if state is not None:
            out.append({"pid": pid, "comm": info.comm if info else "?", **state.to_dict(),
                        "describe": state.describe()})
    return out


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
                  poll_s: float = POLL_S) -> list[Ended]:
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
    sent: set[int] = set()

    def remaining() -> list[int]:
        return [pid for fd, pid, *_ in pinned if not _exited(fd, pid)]

    def send(sig: int) -> None:
        live = set(remaining())
        for fd, pid, *_ in pinned:
            if pid in live:
                try:
                    signal.pidfd_send_signal(fd, sig)
                    sent.add(pid)
                except ProcessLookupError:
                    pass

    try:
        result = escalate(send, remaining, grace_s, poll_s) if pinned else Escalation("SIGTERM", [], [])
        elapsed = round(time.monotonic() - t0, 3)
        for fd, pid, cmd, why in pinned:
            sig = "SIGKILL" if pid in result.killed else ("SIGTERM" if pid in sent else "none")
            stuck = None if _exited(fd, pid) else procfs.task_state(pid)
            outcome = "survived SIGKILL" if stuck else "exited"
            results.append(Ended(pid, cmd, why, sig, outcome, elapsed, stuck.describe() if stuck else ""))
    finally:
        for fd, *_ in pinned:
            os.close(fd)
    return results
