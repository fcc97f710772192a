"""The coordinator of a fanned-out phase: Prefect's part of eagle3.fanout (docs/fanout.md).

Each shard is a flow run of the `eagle3-shard/<pool>` deployment, sent to a node pool with
run_deployment; the node's worker runs it. Shard i starts on pool i mod len(pools), counting only the
pools with a live worker when some have none (those are named at once, and so is a start with no live
worker anywhere). A worker is lost once its last heartbeat is older than fanout.worker_lost_after_s
(eagle3/fanout/workers.py); a shard still waiting after fanout.start_timeout_s, on a pool with no live
worker, moves to the next pool with one (a node gone before its shard started). The coordinator
watches the runs' states and the shards' heartbeats (files on the shared run dir): a shard that
failed retryably, or whose heartbeat went silent (its node or worker died: its flow run is then
marked Crashed), goes to the next pool with an online worker, or waits on its own pool for a
worker to come back, keeping what it finished. When every shard is done, the phase row's merge
makes the phase's own output, and run_phase marks it done. Scheduling is Prefect's: pools, workers
and their concurrency limits (one shard per node at a time)."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.states import Cancelled, Crashed

from eagle3 import phase_table, progress
from eagle3.config.fanout import fanned_phases
from eagle3.errors import ConfigError, PipelineError
from eagle3.fanout import workers
from eagle3.run import shard_ledger as ledger
from eagle3.fanout.node import shard_config
from eagle3.slices import Shard
from eagle3.phase_runner import is_done

REPO = Path(__file__).resolve().parent.parent
SHARD_FLOW = "eagle3-shard"
ENTRYPOINT = "flows/shard.py:eagle3_shard"
NOT_RETRYABLE = "not retryable: "  # flows/shard.py's prefix on a failure another node cannot fix
_FAILED = {StateType.FAILED, StateType.CRASHED, StateType.CANCELLED}


class ShardFailed(PipelineError):
    """A shard failed for good: on every attempt it had, or with a cause another node cannot fix."""


def check_pools(cfg, phases: list[str], flow_run_id=None) -> None:
    """Before anything starts: every pool of a run that fans out exists on the Prefect server, and the
    coordinator (this flow run) is not itself running in one of them: a node pool runs one flow run at
    a time, so its shards there would wait for the coordinator forever."""
    if not fanned_phases(cfg, phases):
        return
    with get_client(sync_client=True) as client:
        missing = []
        for pool in cfg.fanout.pools:
            try:
                client.read_work_pool(pool)
            except ObjectNotFound:
                missing.append(pool)
        url = client.api_url
        own = client.read_flow_run(flow_run_id).work_pool_name if flow_run_id else None
    if own in cfg.fanout.pools:
        raise ConfigError(f"fanout.pools: this pipeline run runs on pool {own!r}, one of the node pools its shards go "
                          f"to, where they would wait for it (one flow run per node at a time). Deploy the pipeline "
                          f"to a pool of its own (e.g. `prefect work-pool create eagle3-coordinator --type process`), "
                          f"or start it with `eagle3 run`")
    if missing:
        names = ", ".join(repr(p) for p in missing)
        raise ConfigError(
            f"fanout.pools: work pool {names} does not exist on the Prefect server {url}. Create it: "
            + "; ".join(f"`prefect work-pool create {p} --type process` and `prefect work-pool set-concurrency-limit "
                        f"{p} 1`, then start its worker on that node (`prefect worker start --pool {p}`)" for p in missing)
            + "; or remove it from fanout.pools")


def ensure_deployments(client, pools: list[str]) -> None:
    """One `eagle3-shard/<pool>` deployment per pool, run from this checkout's path (the same path on
    every node, like the run dir: docs/fanout.md); created or updated on every fan-out."""
    flow_id = client.create_flow_from_name(SHARD_FLOW)
    for pool in pools:
        client.create_deployment(
            flow_id=flow_id, name=pool, work_pool_name=pool, entrypoint=ENTRYPOINT, path=str(REPO),
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}],
            tags=["eagle3", "shard", pool], enforce_parameter_schema=False,
            description="One shard of a fanned-out EAGLE-3 phase on this node (created by the pipeline flow).")


@dataclass
class Attempt:
    shard: Shard
    pool: str
    number: int
    run_id: object
    started: float = field(default_factory=time.time)
    running_since: float | None = None
    state: str = "submitted"
    host: str = ""
    cause: str = ""
    done: int | None = None
    total: int | None = None
    earlier: list = field(default_factory=list)  # the entries of this shard's failed attempts

    def entry(self) -> dict:
        return {"index": self.shard.index, "pool": self.pool, "attempt": self.number, "flow_run": str(self.run_id),
                "state": self.state, "host": self.host, "cause": self.cause, "done": self.done, "total": self.total,
                "sent_at": self.started, "earlier": self.earlier}

    def summary(self) -> str:
        count = f" {self.done or 0}/{self.total}" if self.total else ""
        where = f" on {self.host or self.pool}" if not self.state.startswith("waiting") else ""
        return f"{self.shard.index + 1}/{self.shard.count}{count} {self.state}{where}"


def fanned_out(cfg, config_path: str, phase: str, upstream: str | None, force: bool, force_token: str | None):
    """run_phase's body for a phase this config fans out (None: the phase runs here, as always)."""
    if not fanned_phases(cfg, [phase]):
        return None

    def body(cfg, sup):
        return Coordinator(cfg, config_path, phase, upstream, force, force_token).run()

    return body


class Coordinator:
    """One fanned-out phase: its shards sent, watched and retried, then merged."""

    def __init__(self, cfg, config_path: str, phase: str, upstream: str | None, force: bool, force_token: str | None):
        self.cfg, self.config_path, self.phase = cfg, config_path, phase
        self.params = {"upstream": upstream, "force": force, "force_token": force_token}
        self.fanout = cfg.fanout
        self.shards = [Shard(phase, i, cfg.fanout.count(phase)) for i in range(cfg.fanout.count(phase))]
        self.key = force_token or uuid.uuid4().hex  # this coordinator's run, in the ledger's history
        self.said = ""  # the last shard summary shown on the console
        self.log = get_run_logger()

    def run(self):
        if problem := ledger.legacy_dirs_problem(self.cfg.run_dir, self.phase):
            raise ConfigError(problem)
        pools = self.fanout.pools
        with get_client(sync_client=True) as client:
            ensure_deployments(client, pools)
            place = self._placement(client)
            live = {s.index: self._submit(s, place[s.index % len(place)], 1) for s in self.shards}
            finished: dict[int, Attempt] = {}
            try:
                while live:
                    for index, attempt in list(live.items()):
                        outcome = self._look(client, attempt)
                        if outcome == "done":
                            finished[index] = live.pop(index)
                        elif outcome == "failed":
                            live[index] = self._retry(client, attempt)
                        elif outcome.startswith("move:"):
                            live[index] = self._resend(attempt, outcome.split(":", 1)[1])
                    self._record([*finished.values(), *live.values()])
                    if live:
                        time.sleep(self.fanout.poll_interval_s)
            except BaseException:
                with contextlib.suppress(OSError):  # the record says how it ended; it must not hide why
                    self._record([*finished.values(), *live.values()])
                self._cancel(client, live.values())
                raise
        merge = phase_table.get(self.phase).merge()
        progress.step(self.phase, f"merging {len(self.shards)} shards")
        return merge(self.cfg, [shard_config(self.cfg, s) for s in self.shards])

    def _submit(self, shard: Shard, pool: str, number: int) -> Attempt:
        run = run_deployment(f"{SHARD_FLOW}/{pool}", timeout=0, as_subflow=True,
                             flow_run_name=f"{self.cfg.name}: {shard.label} (attempt {number})",
                             parameters={"config_path": str(self.config_path), "phase": self.phase,
                                         "index": shard.index, "count": shard.count, **self.params})
        self.log.info("%s: sent to pool %s (attempt %d, flow run %s)", shard.label, pool, number, run.id)
        return Attempt(shard, pool, number, run.id)

    def _look(self, client, a: Attempt) -> str:
        """'done', 'failed' (a.cause says why) or 'running' (includes waiting for a worker)."""
        state = client.read_flow_run(a.run_id).state
        beat = ledger.heartbeat(self.cfg.run_dir, a.shard)
        if beat and beat.get("at", 0) >= a.started - 1:
            a.host = str(beat.get("host", ""))
        # Progress is this attempt's own: nothing before it runs (a forced rerun does not show the last run's).
        a.done, a.total = ledger.progress_of(self.cfg.run_dir, a.shard, since=a.started) if a.host else (None, None)
        a.state = state.name if state else "unknown"
        if state is None or state.type in (StateType.SCHEDULED, StateType.PENDING, StateType.PAUSED):
            return self._waiting(client, a) if state is None or state.type == StateType.SCHEDULED else "running"
        if state.type == StateType.COMPLETED:
            return "done"
        if state.type in _FAILED:
            said = state.message or state.name
            if said.startswith(NOT_RETRYABLE):
                raise ShardFailed(f"{a.shard.label} failed on pool {a.pool}{self._on(a)}: {said[len(NOT_RETRYABLE):]}")
            if is_done(shard_config(self.cfg, a.shard), self.phase, self.params["upstream"]):
                # Its process died after the phase had finished (a worker lost at the end): the output is
                # complete and verified (its done marker for this upstream, every output present).
                a.cause = f"its flow run ended {state.name} ({said}) after its output was complete and verified"
                a.state = f"Completed (verified after its run ended {state.name})"
                self.log.warning("%s: %s; counted as done", a.shard.label, a.cause)
                return "done"
            a.cause = self._cause(client, a, state, said)
            return "failed"
        now = time.time()
        a.running_since = a.running_since or now
        last = max(float(beat["at"]) if beat else 0.0, a.running_since)
        if now - last > self.fanout.heartbeat_timeout_s:
            a.cause = (f"no heartbeat for {now - last:.0f} s (fanout.heartbeat_timeout_s "
                       f"{self.fanout.heartbeat_timeout_s:g}): its node or worker died")
            client.set_flow_run_state(a.run_id, Crashed(message=a.cause), force=True)
            a.state = "lost"
            return "failed"
        return "running"

    def _cause(self, client, a: Attempt, state, said: str) -> str:
        """The real cause of a failed attempt: the phase's own error as the shard recorded it, else (a
        crash: Prefect's wording names no cause) the loss of its pool's worker, when it has none alive."""
        view = self._workers(client, a.pool)
        if state.type == StateType.CRASHED and not view.online:
            return f"{view.why_not()}{self._on(a)} (Prefect: {said})"
        return said

    def _waiting(self, client, a: Attempt) -> str:
        """'running' while a shard may wait; 'move:POOL' once it waited past fanout.start_timeout_s on a
        pool with no live worker while POOL has one (its run is cancelled first: it never started)."""
        waited = time.time() - a.started  # it has waited since it was sent: it has not started
        view = self._workers(client, a.pool)
        a.state = workers.waiting_words(view, None if not view.online else self._busy_with(client, a))
        if waited < self.fanout.start_timeout_s or view.online:
            return "running"
        other = self._next_pool(client, a.pool)
        if other == a.pool:
            return "running"  # no pool has a worker: it waits for one to come back
        a.cause = f"not started after {waited:.0f} s (fanout.start_timeout_s {self.fanout.start_timeout_s:g}): {view.why_not()}"
        client.set_flow_run_state(a.run_id, Cancelled(message=a.cause), force=True)
        a.state = "moved"
        return f"move:{other}"

    def _busy_with(self, client, a: Attempt) -> str | None:
        """The name of the run that holds the pool's worker while this shard waits for it, if any."""
        from prefect.client.schemas.filters import (FlowRunFilter, FlowRunFilterId, FlowRunFilterState,
                                                    FlowRunFilterStateType, WorkPoolFilter, WorkPoolFilterName)

        runs = client.read_flow_runs(
            work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[a.pool])),
            flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
                any_=[StateType.RUNNING, StateType.PENDING])), id=FlowRunFilterId(not_any_=[a.run_id])), limit=1)
        return runs[0].name if runs else None

    def _resend(self, a: Attempt, pool: str) -> Attempt:
        """A shard that never started goes to `pool`; not a failed attempt, so fanout.retries is untouched."""
        self.log.warning("%s: %s; sent to pool %s", a.shard.label, a.cause, pool)
        progress.note(self.phase, f"{a.shard.label}: {a.cause}; moved to {pool}", ok=False)
        moved = self._submit(a.shard, pool, a.number + 1)
        moved.earlier = [*a.earlier, {k: v for k, v in a.entry().items() if k != "earlier"}]
        return moved

    def _placement(self, client) -> list[str]:
        """The pools shards start on: those with a live worker, the others named at once; every pool
        when none has one (the shards then wait for workers, which is said too)."""
        pools = self.fanout.pools
        views = {p: self._workers(client, p) for p in pools}
        online = [p for p in pools if views[p].online]
        if not online:
            said = (f"no pool has a live worker ({'; '.join(v.why_not() for v in views.values())}): the shards wait "
                    f"on their pools until one starts (`prefect worker start --pool POOL` on its node)")
            self.log.warning("%s: %s", self.phase, said)
            progress.note(self.phase, said, ok=False)
        elif len(online) < len(pools):
            idle = "; ".join(views[p].why_not() for p in pools if p not in online)
            self.log.warning("%s: %s; its shards start on %s", self.phase, idle, ", ".join(online))
            progress.note(self.phase, f"{idle}: shards start on {', '.join(online)}", ok=False)
        return online or list(pools)

    def _workers(self, client, pool: str) -> workers.PoolWorkers:
        seen = [workers.Worker(w.name, str(getattr(w.status, "value", w.status)),
                               w.last_heartbeat_time.timestamp() if w.last_heartbeat_time else None,
                               w.heartbeat_interval_seconds)
                for w in client.read_workers_for_work_pool(work_pool_name=pool)]
        return workers.look(pool, seen, time.time(), self.fanout.worker_lost_after_s)

    def _on(self, a: Attempt) -> str:
        return f" (host {a.host})" if a.host else ""

    def _retry(self, client, a: Attempt) -> Attempt:
        if a.number > self.fanout.retries:
            raise ShardFailed(f"{a.shard.label} failed on pool {a.pool}{self._on(a)} after {a.number} attempts "
                              f"(fanout.retries {self.fanout.retries}): {a.cause}")
        pool = self._next_pool(client, a.pool)
        self.log.warning("%s failed on pool %s%s: %s; retrying on pool %s", a.shard.label, a.pool, self._on(a),
                         a.cause, pool)
        progress.note(self.phase, f"{a.shard.label} failed on {a.pool}{self._on(a)} ({a.cause}); retry on {pool}",
                      ok=False)
        retry = self._submit(a.shard, pool, a.number + 1)
        retry.earlier = [*a.earlier, {k: v for k, v in a.entry().items() if k != "earlier"}]
        return retry

    def _next_pool(self, client, failed: str) -> str:
        """The next pool after `failed` with an online worker; `failed` itself when none has one (its
        shard then waits for a worker to come back)."""
        pools = self.fanout.pools
        start = pools.index(failed) if failed in pools else -1
        for pool in pools[start + 1:] + pools[:start + 1]:
            if self._workers(client, pool).online:
                return pool
        return failed

    def _record(self, attempts: list[Attempt]) -> None:
        attempts = sorted(attempts, key=lambda a: a.shard.index)
        ledger.write(self.cfg.run_dir, self.phase, [a.entry() for a in attempts], run=self.key)
        totals = [a.total for a in attempts if a.total]
        if len(totals) == len(attempts):
            progress.emit(progress.Event(self.phase, progress.PROGRESS, done=sum(a.done or 0 for a in attempts),
                                         total=sum(totals), detail={"shards": len(attempts)}))
        said = "shards " + "; ".join(a.summary() for a in attempts)
        if said != self.said:  # the console's line: what each shard is doing, shown when it changes
            self.said = said
            progress.step(self.phase, said)

    def _cancel(self, client, attempts) -> None:
        """The coordinator stops (an error, a cancel): its shards' runs stop too; each node's worker ends
        its flow-run process, whose supervisor ends its servers."""
        from prefect.states import Cancelling

        for a in attempts:
            try:
                client.set_flow_run_state(a.run_id, Cancelling(message="the coordinator stopped"), force=True)
            except Exception as e:  # noqa: BLE001 - cancelling the rest must not hide why the coordinator stopped
                self.log.warning("could not cancel %s (flow run %s): %s", a.shard.label, a.run_id, e)
