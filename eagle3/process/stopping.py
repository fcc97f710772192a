"""Stopping what a registry entry names, after proving it ours (`proof`): its process group, or,
with no live leader, only the members that carry the run's token. The signals go through the one
ending implementation, eagle3.process.terminate.escalate."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from . import procfs
from .registry import OWNER_ENV, SERVICE_ENV, Entry
from .terminate import escalate, stuck

log = logging.getLogger("eagle3.services")


@dataclass
class StopOutcome:
    id: str
    name: str
    pgid: int
    members: list[dict]
    signal: str  # "none" (already gone), "SIGTERM", "SIGKILL", or "skipped"
    seconds: float
    survivors: list[int]
    note: str = ""
    stuck: list[dict] = field(default_factory=list)  # survivors of SIGKILL: pid, comm, kernel state, wchan

    @property
    def clean(self) -> bool:
        return not self.survivors


def proof(entry: Entry, token: str) -> str:
    """What a registry entry read back from disk proves, on its own:
      "ours"     - its leader is alive, has the recorded start ticks, leads its own group, and
                   carries this run's owner token in its environment: its group may be signalled;
      "gone"     - no live leader: only members that carry the token may be signalled, one by one;
      "reused"   - the leader PID now belongs to a process with another start time;
      "unproven" - a live process that does not carry the token (PID and start ticks are
                   world-readable in /proc: anyone who could write the registry could name them).
    Linux never hands out a PID that is still in use as a process-group id, so while the proven
    leader lives, its group is the one we started."""
    alive = entry.is_leader_alive_and_ours()
    if alive is None:
        return "gone"
    if alive is False:
        return "reused"
    if entry.pgid == entry.pid and token and procfs.environ_value(entry.pid, OWNER_ENV) == token:
        return "ours"
    return "unproven"


def _skip_note(entry: Entry, verdict: str) -> str:
    if verdict == "reused":
        return f"PID {entry.pid} now belongs to another process (start time differs); left alone"
    return (f"registry entry names PID {entry.pid} which does not carry this run's token: left alone "
            "(and dropped from the registry)")


def _live(pids: list[int]) -> list[int]:
    return [p for p in pids if procfs.alive(p)]


def _escaped(entry: Entry, token: str) -> list[int]:
    """Processes of this service that left its group (e.g. called setsid) but kept our markers."""
    found = []
    for info in procfs.all_procs():
        if info.zombie or info.pgid == entry.pgid:
            continue
        if procfs.environ_value(info.pid, SERVICE_ENV) == entry.id and procfs.environ_value(info.pid, OWNER_ENV) == token:
            found.append(info.pid)
    return found


def _as_members(escaped: list[int]) -> list[dict]:
    out = []
    for pid in escaped:
        info = procfs.read_stat(pid)
        out.append({"pid": pid, "comm": info.comm if info else "?", "escaped": True})
    return out


LEFT_AFTER_LEADER_S = 5.0  # grace for what a leader that stopped in time left in its group


def _signal_leader(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def stop_entry(entry: Entry, token: str, grace_s: float, reap: Callable[[], object] | None = None,
               own_child: bool = False, leader_first: bool = False) -> StopOutcome:
    """Stop what `entry` names. `own_child`: the caller launched it and holds its Popen (the entry
    is the one in memory, not one read back from the registry file), which proves it ours.
    `leader_first` (own children only): SIGTERM to the leader alone, which ends its own children;
    the group is signalled only for what is left after `grace_s`. SGLang needs this: a child that
    gets SIGTERM itself reads to its leader as a crash (SIGQUIT, five seconds of crash diagnostics)."""
    t0 = time.monotonic()
    verdict = proof(entry, token)
    if own_child:
        group_ours = verdict != "reused"
    else:
        group_ours = verdict == "ours"
    members = [{"pid": p.pid, "comm": p.comm} for p in procfs.group_members(entry.pgid)] if group_ours else []
    # Processes that left the group are found by a scan of every process's markers, which takes longer than
    # anything else here: with a group of ours to signal, it runs right after that group's SIGTERM, not before
    # it (a GPU's release waits on the group's exit; the scan need not).
    late = bool(members)
    escaped = [] if late else _escaped(entry, token)
    if verdict == "gone" and not own_child:
        escaped += [p.pid for p in procfs.group_members(entry.pgid)
                    if p.pid not in escaped and procfs.environ_value(p.pid, OWNER_ENV) == token]
    if not group_ours and not escaped and verdict in ("reused", "unproven"):
        if verdict == "unproven":
            log.warning("registry %s: %s", entry.id, _skip_note(entry, verdict))
        return StopOutcome(entry.id, entry.name, entry.pgid, [], "skipped", 0.0, [], note=_skip_note(entry, verdict))
    members += _as_members(escaped)
    if not members:
        if reap:
            reap()
        return StopOutcome(entry.id, entry.name, entry.pgid, [], "none", time.monotonic() - t0, [])

    def find_late() -> None:
        nonlocal late
        if late:
            late = False
            found = _escaped(entry, token)
            escaped.extend(found)
            members.extend(_as_members(found))

    def remaining() -> list[int]:
        if reap:
            reap()
        group = [p.pid for p in procfs.group_members(entry.pgid)] if group_ours else []
        return group + _live(escaped)

    def send(sig: int) -> None:
        if group_ours:
            try:
                os.killpg(entry.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        find_late()
        for pid in _live(escaped):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    result = None
    if leader_first and own_child and group_ours and procfs.alive(entry.pid):
        # Our unreaped child: its PID cannot have been handed to another process.
        result = escalate(lambda sig: (_signal_leader(entry.pid, sig), find_late()), remaining, grace_s, kill=False)
    if result is None or result.killed:
        result = escalate(send, remaining, grace_s if result is None else LEFT_AFTER_LEADER_S)
    if reap:
        reap()  # the leader may have turned zombie after the last poll; do not leave it unreaped
    left, stuck_ones = result.survivors, stuck(result.survivors)
    note = "" if not left else ("survived SIGKILL (" + "; ".join(f"PID {t['pid']}: {t['describe']}" for t in stuck_ones)
                                + "): drain or reboot the node")
    if not group_ours and verdict != "gone":
        why = "now belongs to another process" if verdict == "reused" else "does not carry this run's token"
        note = (f"PID {entry.pid} {why} (group left alone); "
                f"ended processes carrying this service's markers. {note}").strip()
    return StopOutcome(entry.id, entry.name, entry.pgid, members, result.signal, round(time.monotonic() - t0, 3), left,
                       note=note, stuck=stuck_ones)
