"""The pipeline and benchmark deployments of deployments/prefect.yaml, run by a real worker
against a real server: completion, the GPU lease (pool concurrency 1), task retry of a transient
failure, flow-run retry after a gate failure (finished phases come back Cached), `force`, and a
schedule firing a benchmark rerun. Phases are the no-op ones (noop_phases.py); every assertion
is on what the server recorded (flow/task-run states) and on what the phase bodies did (call
counts, output files)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from flowkit import (BENCHMARK, PHASES, PIPELINE, POOL, REPO, client, config, params, phase_states, prefect_cli,
                     submit, task_runs, wait_final, wait_until)
from noop_phases import counts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HANDOFFS = [f"handoff-after-{p}" for p in ("start", *PHASES)]


@dataclass
class Wave:
    configs: dict   # key -> (config path, run dir)
    ids: dict       # key -> flow run id
    runs: dict      # key -> FlowRun (final)


@pytest.fixture(scope="module")
def wave(worker, tmp_path_factory) -> Wave:
    """Three full-pipeline runs submitted to the GPU pool at the same moment: A plain, B whose
    train fails once with a transient error, D whose train fails once on a gate."""
    base = tmp_path_factory.mktemp("wave")
    configs = {"A": config(base / "a", "wave-a"),
               "B": config(base / "b", "wave-b", {"fail_once": {"train": "transient"}}),
               "D": config(base / "d", "wave-d", {"fail_once": {"train": "gate"}})}
    ids = {key: submit(PIPELINE, params(path)) for key, (path, _) in configs.items()}
    final = wait_final(ids.values(), timeout=600)
    return Wave(configs, ids, {key: final[rid] for key, rid in ids.items()})


def test_deployments_from_prefect_yaml(deployed):
    with client() as c:
        pool = c.read_work_pool(POOL)
        pipe = c.read_deployment_by_name(PIPELINE)
        bench = c.read_deployment_by_name(BENCHMARK)
    assert pool.type == "process" and pool.concurrency_limit == 1
    for dep, entry in ((pipe, "flows/pipeline.py:eagle3_pipeline"), (bench, "flows/benchmark.py:eagle3_benchmark")):
        assert dep.entrypoint == entry and dep.work_pool_name == POOL
        assert dep.pull_steps == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    assert not pipe.schedules, "the full pipeline is run by hand"
    assert [(s.schedule.cron, s.active) for s in bench.schedules] == [("0 3 * * *", True)]


def test_pipeline_deployment_run_completes(wave):
    run = wave.runs["A"]
    _, run_dir = wave.configs["A"]
    assert run.state.is_completed(), run.state
    assert run.work_pool_name == POOL and run.infrastructure_pid, "run by the pool's worker"
    trs = task_runs(run.id)
    assert phase_states(run.id) == dict.fromkeys(PHASES, "Completed")
    assert {h: trs[h].state.name for h in HANDOFFS} == dict.fromkeys(HANDOFFS, "Completed")
    assert "preflight" not in trs  # doctor=False
    assert counts(run_dir) == dict.fromkeys(PHASES, 1)
    for phase in PHASES:
        assert (run_dir / phase / "output.txt").read_text().startswith(f"{phase} output of call 1")
        assert json.loads((run_dir / "state" / f"{phase}.done.json").read_text())["phase"] == phase
    assert len(list((run_dir / "handoffs").glob("*.json"))) == len(HANDOFFS)


def test_gpu_runs_on_one_node_never_overlap(wave):
    """Submitted together; the pool (limit 1) lets one run at a time: from the moment a run is
    handed to the worker (Pending) until its final state, no other run of the pool is active."""
    intervals = []
    with client() as c:
        for key, rid in wave.ids.items():
            states = sorted(c.read_flow_run_states(rid), key=lambda s: s.timestamp)
            pending = [s.timestamp for s in states if s.type.value == "PENDING"]
            final = [s.timestamp for s in states if s.is_final()]
            assert pending and final, (key, [s.name for s in states])
            intervals.append((pending[0], final[-1], key, wave.runs[key].created))
    intervals.sort()
    created = [i[3] for i in intervals]
    assert max(created) - min(created) < timedelta(seconds=10), "the runs were submitted together"
    for (s1, e1, k1, _), (s2, e2, k2, _) in zip(intervals, intervals[1:]):
        assert s2 >= e1, f"run {k2} started at {s2} while run {k1} was active until {e1}"


def test_transient_failure_is_retried_by_the_task(wave):
    run = wave.runs["B"]
    _, run_dir = wave.configs["B"]
    assert run.state.is_completed(), run.state
    trs = task_runs(run.id)
    assert phase_states(run.id) == dict.fromkeys(PHASES, "Completed")
    assert trs["train"].run_count == 2 and trs["datagen"].run_count == 1
    with client() as c:
        names = [s.name for s in sorted(c.read_task_run_states(trs["train"].id), key=lambda s: s.timestamp)]
    assert "AwaitingRetry" in names and names[-1] == "Completed", names
    assert counts(run_dir) == {"datagen": 1, "extract": 1, "train": 2, "bench": 1}


def test_gate_failure_is_not_retried_and_a_flow_run_retry_skips_finished_phases(wave, prefect_server):
    run = wave.runs["D"]
    _, run_dir = wave.configs["D"]
    assert run.state.is_failed(), run.state
    first = task_runs(run.id, attempt=1)
    assert phase_states(run.id, attempt=1) == {"datagen": "Completed", "extract": "Completed", "train": "Failed"}
    assert first["train"].run_count == 1, "a gate failure must not be retried"
    assert counts(run_dir) == {"datagen": 1, "extract": 1, "train": 1, "bench": 0}

    # The operator fixed the cause and retries the flow run (same id; rescheduled for the worker).
    prefect_cli(prefect_server, "flow-run", "retry", str(run.id))
    again = wait_final([run.id], timeout=300)[run.id]
    assert again.state.is_completed(), again.state
    assert again.id == run.id and again.run_count == 2
    assert phase_states(run.id, attempt=2) == {"datagen": "Cached", "extract": "Cached", "train": "Completed",
                                               "bench": "Completed"}
    second = task_runs(run.id, attempt=2)
    assert {h: second[h].state.name for h in HANDOFFS} == dict.fromkeys(HANDOFFS, "Completed"), "never cached"
    assert counts(run_dir) == {"datagen": 1, "extract": 1, "train": 2, "bench": 1}


def test_force_reruns_the_forced_phase_and_what_depends_on_it_only(wave):
    path, run_dir = wave.configs["A"]
    before = json.loads((run_dir / "state" / "extract.done.json").read_text())["fingerprint"]
    rid = submit(PIPELINE, params(path, force=["extract"]))
    run = wait_final([rid], timeout=300)[rid]
    assert run.state.is_completed(), run.state
    assert phase_states(rid) == {"datagen": "Cached", "extract": "Completed", "train": "Completed",
                                 "bench": "Completed"}
    assert counts(run_dir) == {"datagen": 1, "extract": 2, "train": 2, "bench": 2}
    markers = {p: json.loads((run_dir / "state" / f"{p}.done.json").read_text()) for p in PHASES}
    assert markers["extract"]["fingerprint"] != before
    assert markers["train"]["upstream"] == markers["extract"]["fingerprint"]


def test_schedule_fires_a_benchmark_rerun(wave):
    """An interval schedule on the benchmark deployment (first slot 15 s out): the server's scheduler
    creates the run, the worker runs it, and only the bench phase is redone (with its handoffs)."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.schedules import IntervalSchedule

    path, run_dir = wave.configs["A"]
    before = counts(run_dir)
    with client() as c:
        dep = c.read_deployment_by_name(BENCHMARK)
        anchor = datetime.now(timezone.utc) + timedelta(seconds=15)
        (sched,) = c.create_deployment_schedules(
            dep.id, [(IntervalSchedule(interval=timedelta(days=1), anchor_date=anchor), True)],
            parameters=params(path))
    try:
        def scheduled_run():
            with client() as c:
                runs = c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])))
            return next((r for r in runs if r.auto_scheduled and r.parameters.get("config_path") == path
                         and abs((r.expected_start_time - anchor).total_seconds()) < 1), None)

        created = wait_until(scheduled_run, 120, "the scheduler to create the benchmark run")
        run = wait_final([created.id], timeout=300)[created.id]
    finally:
        with client() as c:
            c.delete_deployment_schedule(dep.id, sched.id)
    assert run.state.is_completed(), run.state
    assert run.start_time >= anchor - timedelta(seconds=1), "started at its scheduled time, not before"
    trs = task_runs(run.id)
    assert phase_states(run.id) == {"bench": "Completed"}
    assert trs["handoff-after-start"].state.name == trs["handoff-after-bench"].state.name == "Completed"
    assert counts(run_dir) == before | {"bench": before["bench"] + 1}


def test_a_deployment_run_on_a_run_dir_another_run_holds_fails_naming_it(wave, spawner):
    """A scheduled benchmark (or any deployment run) while another run holds the run dir: the flow
    run fails at once naming that run, and hands off nothing; with `lease_wait_s` it waits for it."""
    import textwrap

    from eagle3.process import procfs

    path, run_dir = wave.configs["A"]
    reports = sorted((run_dir / "handoffs").glob("*.json"))
    holder = spawner.start(textwrap.dedent(f"""
        import sys, time
        from eagle3.process.lease import hold
        with hold({str(run_dir)!r}):
            print("ready", flush=True)
            time.sleep(600)
    """))
    rid = submit(BENCHMARK, params(path, lease_wait_s=0))  # the deployment's default waits an hour
    run = wait_final([rid], timeout=300)[rid]
    assert run.state.is_failed(), run.state
    assert f"PID {holder.pid}" in run.state.message and "is in use by" in run.state.message
    assert sorted((run_dir / "handoffs").glob("*.json")) == reports, "a refused run must not hand off"
    assert procfs.alive(holder.pid)

    before = counts(run_dir)
    rid = submit(BENCHMARK, params(path))
    wait_until(lambda: _state_name(rid) == "Running", 120, "the waiting run to start")
    time.sleep(3)
    assert counts(run_dir) == before, "the waiting run must not start its phase while the lease is held"
    holder.kill()  # releasing by exit: the kernel drops the lease
    run = wait_final([rid], timeout=300)[rid]
    assert run.state.is_completed(), run.state
    assert counts(run_dir) == before | {"bench": before["bench"] + 1}


def _state_name(run_id) -> str:
    with client() as c:
        return c.read_flow_run(run_id).state.name
