"""Whether a pool can start a shard, as the operator needs to know it: no worker, a worker lost, a
worker busy with another run, or one that will pick the shard up.

Prefect itself calls a worker OFFLINE only after three of its heartbeat intervals without a beat
(its foreman's INACTIVITY_HEARTBEAT_MULTIPLE), and checks that on its own schedule: a SIGKILLed
worker stayed ONLINE for ~93 s on 2026-12-06. The pack counts a worker lost sooner, after
`fanout.worker_lost_after_s`, by default two of the worker's own heartbeat intervals (one missed
beat is tolerated, two are not), so the wait before a move is the pack's stated number."""

from __future__ import annotations

from dataclasses import dataclass

PREFECT_HEARTBEAT_S = 30.0  # PREFECT_WORKER_HEARTBEAT_SECONDS' default, for a worker that did not say its own
MISSED_BEATS = 2


@dataclass(frozen=True)
class Worker:
    name: str
    status: str                  # Prefect's word: ONLINE or OFFLINE
    last_beat_at: float | None   # epoch seconds
    interval_s: float | None     # the worker's own heartbeat interval, as it reported it


def lost_after_s(worker: Worker, configured: float | None) -> float:
    return configured if configured else MISSED_BEATS * (worker.interval_s or PREFECT_HEARTBEAT_S)


@dataclass(frozen=True)
class PoolWorkers:
    pool: str
    alive: tuple[str, ...]
    lost: tuple[tuple[str, float, float], ...]  # (name, seconds since its last beat, the bound it passed)

    @property
    def online(self) -> bool:
        return bool(self.alive)

    def why_not(self) -> str:
        """Why nothing on this pool can start a shard (call when not online)."""
        if not self.lost:
            return f"pool {self.pool} has no worker"
        name, age, bound = max(self.lost, key=lambda w: -w[1])  # the one heard from last
        return (f"the worker of pool {self.pool} is lost (last heartbeat {age:.0f} s ago; counted lost after "
                f"{bound:g} s)")


def look(pool: str, workers: list[Worker], now: float, configured_lost_after: float | None = None) -> PoolWorkers:
    alive, lost = [], []
    for w in workers:
        age = now - w.last_beat_at if w.last_beat_at is not None else float("inf")
        bound = lost_after_s(w, configured_lost_after)
        if w.status.upper() == "ONLINE" and age <= bound:
            alive.append(w.name)
        else:
            lost.append((w.name, age, bound))
    return PoolWorkers(pool, tuple(alive), tuple(lost))


def worst_wait_s(start_timeout_s: float, lost_after: float, poll_interval_s: float) -> float:
    """The longest a shard waits on a pool whose worker died just before the phase, before it moves:
    the worker is counted lost at most `lost_after` after its last beat (which came before the phase
    started), and the coordinator looks every poll interval."""
    return max(start_timeout_s, lost_after) + poll_interval_s


def waiting_words(view: PoolWorkers, busy_with: str | None) -> str:
    """What a shard that has not started is waiting for, in one phrase."""
    if not view.online:
        return f"waiting: {view.why_not()}"
    if busy_with:
        return f"waiting: the worker of pool {view.pool} is busy (running {busy_with!r})"
    return f"waiting for the worker of pool {view.pool} to pick it up"
