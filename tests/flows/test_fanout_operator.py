"""Fan-out as the operator sees it (issue 57), for real: the session's `prefect server`, two node pools with
real `prefect worker` processes, `eagle3 run` as the coordinator, and instant stand-in phases
(noop_phases.SHARDED: datagen shardable, each shard reporting progress 1..4 over ~3 s).

One story, three coordinator runs of the same config:
1. No worker anywhere when the phase starts: said at once. Worker A comes up; the shard sent to B moves to
   A, where it waits while A runs the other shard: "busy (running '... shard 1/2 ...')", not "dead". The
   console shows the shards' line, and every shard dir, line and label counts shards from 1.
2. A forced rerun with B's worker alive (heartbeat every 2 s, never picking work up) when its shard is
   sent, then SIGKILLed: the shard moves once the worker's heartbeat is 2 intervals old, within the stated
   bound, and its cause says so; no attempt shows the last run's progress before it runs.
3. Another forced rerun: the ledger still holds both earlier runs, the first run's move included."""

from __future__ import annotations

import contextvars
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import noop_phases
import pytest
import yaml
from flowkit import PREFECT, REPO, WORKER_STOP, client, stop_groups, wait_until

from eagle3.fanout import workers
from eagle3.layout import RunLayout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
A, B = "eagle3-op-a", "eagle3-op-b"
START_TIMEOUT_S, POLL_S, B_HEARTBEAT_S = 1.0, 0.5, 2


def _pools() -> None:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    with client() as c:
        for pool in (A, B):
            c.create_work_pool(WorkPoolCreate(name=pool, type="process", concurrency_limit=1,
                                              base_job_template=ProcessWorker.get_default_base_job_template()))


def _record(run_dir: Path) -> dict:
    return json.loads(RunLayout(run_dir).shards_record.read_text())["datagen"]


class Background:
    """A loop in a thread for the length of a `with` block; `_loop` runs until `_stop` is set."""

    def __init__(self):
        self._stop = threading.Event()
        # Prefect's settings (the session server's URL) live in context variables, which a thread does not inherit.
        self._thread = threading.Thread(target=contextvars.copy_context().run, args=(self._loop,), daemon=True)

    def _loop(self):
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


class Watch(Background):
    """Every shard entry the ledger held while a coordinator ran (what `eagle3 status` would have shown)."""

    def __init__(self, run_dir: Path):
        self.path, self.seen = RunLayout(run_dir).shards_record, []
        super().__init__()

    def _loop(self):
        while not self._stop.is_set():
            try:
                self.seen += json.loads(self.path.read_text())["datagen"]["shards"]
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.1)


def _worker(pool: str, env: dict, log: Path, **settings) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([PREFECT, "worker", "start", "--pool", pool, "--type", "process"],
                                env=env | {k: str(v) for k, v in settings.items()}, cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _coordinate(path: Path, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([EAGLE3, "run", str(path), "--only", "datagen", "--no-doctor", *extra], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


class ApiLatency(Background):
    """The longest the session's Prefect server took to answer a worker read while a coordinator ran. The
    stated bound counts the coordinator's looks as instant; between a worker's loss and the moved shard's
    submission they are about eight API calls, so a bound's slack grows by eight of the slowest answers seen:
    beside the suite's other worker running vLLM servers a move took 8.5 s against 4.5 + 3 (2026-12-07)."""

    CALLS = 8

    def __init__(self, pool: str):
        self.pool, self.worst = pool, 0.0
        super().__init__()

    def _loop(self):
        with client() as c:
            while not self._stop.is_set():
                t = time.monotonic()
                c.read_workers_for_work_pool(work_pool_name=self.pool)
                self.worst = max(self.worst, time.monotonic() - t)
                self._stop.wait(0.2)

    def slack(self, base_s: float) -> float:
        return base_s + self.CALLS * self.worst


def _heard_from(pool: str) -> bool:
    with client() as c:
        return any(w.last_heartbeat_time for w in c.read_workers_for_work_pool(work_pool_name=pool))


def test_what_the_operator_sees_of_moves_waits_progress_and_history(prefect_server, tmp_path):
    _pools()
    env = prefect_server.env | noop_phases.overrides_env() | {"EAGLE3_PHASE_TABLE": "noop_phases:SHARDED",
                                                              "EAGLE3_PROGRESS_INTERVAL_S": "1"}
    path = noop_phases.write_noop_config(tmp_path, name="fanout-op")
    raw = yaml.safe_load(path.read_text())
    raw["fanout"] = {"pools": [A, B], "shards": {"datagen": 2}, "start_timeout_s": START_TIMEOUT_S,
                     "poll_interval_s": POLL_S, "retries": 0}
    path.write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    layout = RunLayout(run_dir)
    # Each shard reports 1..4 over ~3 s: long enough for the other to wait on a busy worker. Over ~1 s, once in
    # four suite runs of 2026-12-06 (a newcomer `make test` beside `make demo`), no poll saw A busy while the
    # moved shard waited on it.
    for i in (0, 1):
        shard_dir = layout.shard_run_dir("datagen", i, 2)
        shard_dir.mkdir(parents=True)
        (shard_dir / "knobs.json").write_text(json.dumps({"ticks": {"datagen": [4, 0.75]}}))
    procs = []
    try:
        # 1. No worker anywhere; then A's comes up.
        coordinator = _coordinate(path, env)
        with Watch(run_dir) as watch:
            wait_until(lambda: layout.shards_record.is_file() or coordinator.poll() is not None, 120, "shards sent")
            procs.append(_worker(A, env | {"EAGLE3_LOCK_DIR": str(tmp_path / "locks-A")}, tmp_path / "worker-A.log"))
            out, _ = coordinator.communicate(timeout=300)
        assert coordinator.returncode == 0, out[-4000:]
        said = " ".join(out.split())
        assert f"no pool has a live worker (pool {A} has no worker; pool {B} has no worker)" in said, out[-3000:]
        states = {e["state"] for e in watch.seen}
        assert f"waiting: pool {B} has no worker" in states, states
        busy = [s for s in states if s.startswith(f"waiting: the worker of pool {A} is busy")]
        assert busy and all("fanout-op: datagen shard 1/2 (attempt 1)" in s for s in busy), states
        assert not [s for s in states if "lost" in s], "a busy worker is never called lost"
        assert re.search(r"shards 1/2 \d/4 \S.*; 2/2 ", said), "the console shows the shards' line"
        record = _record(run_dir)
        [moved] = [e for e in record["shards"] if e["earlier"]]
        assert moved["earlier"][0]["cause"].endswith(f"pool {B} has no worker"), moved
        assert sorted(p.name for p in (run_dir / "shards" / "datagen").iterdir()) == ["1-of-2", "2-of-2"]

        # 2. B's worker is alive when its shard is sent (it never picks work up), then killed.
        procs.append(_worker(B, env | {"EAGLE3_LOCK_DIR": str(tmp_path / "locks-B")}, tmp_path / "worker-B.log",
                             PREFECT_WORKER_HEARTBEAT_SECONDS=B_HEARTBEAT_S, PREFECT_WORKER_QUERY_SECONDS=3600))
        wait_until(lambda: _heard_from(B), 60, "worker B's first heartbeat")
        coordinator = _coordinate(path, env, "--force", "datagen")
        with Watch(run_dir) as watch, ApiLatency(A) as api:
            wait_until(lambda: any(e["pool"] == B for e in watch.seen) or coordinator.poll() is not None, 120,
                       "a shard sent to B")
            killed_at = time.time()
            procs[-1].send_signal(signal.SIGKILL)
            out, _ = coordinator.communicate(timeout=300)
        assert coordinator.returncode == 0, out[-4000:]
        [moved] = [e for e in _record(run_dir)["shards"] if e["earlier"]]
        before = moved["earlier"][0]
        bound = 2 * B_HEARTBEAT_S
        assert before["pool"] == B and before["state"] == "moved", before
        assert re.search(rf"the worker of pool {B} is lost \(last heartbeat \d+ s ago; counted lost after {bound:g} s\)",
                         before["cause"]), before
        worst = workers.worst_wait_s(START_TIMEOUT_S, bound, POLL_S)
        waited, slack = moved["sent_at"] - before["sent_at"], api.slack(3.0)
        assert waited <= worst + slack, (f"moved {waited:.1f} s after it was sent; the stated bound is {worst:g} s "
                                         f"(+{slack:.1f} s: the API's slowest answer {api.worst:.2f} s)")
        assert moved["sent_at"] - killed_at <= bound + POLL_S + slack
        for e in watch.seen:  # nothing shown as done before the attempt ran: the last run's 4/4 is not this one's
            if e["state"].startswith("waiting") or e["state"] in ("submitted", "moved", "Scheduled", "Pending"):
                assert (e["done"], e["total"]) == (None, None), e

        # 3. Another forced rerun: both earlier runs stay in the ledger.
        rerun = _coordinate(path, env, "--force", "datagen")
        out, _ = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, out[-4000:]
        record = _record(run_dir)
        assert len(record["history"]) == 2 and record["run"] not in {h["run"] for h in record["history"]}
        first = record["history"][0]
        assert any(e["earlier"] and e["earlier"][0]["cause"].endswith(f"pool {B} has no worker")
                   for e in first["shards"]), first
        assert all((e["done"], e["total"]) == (4, 4) for e in record["shards"]), record["shards"]
    finally:
        stop_groups(procs, WORKER_STOP)
