"""Helpers of the flow tests: process control, the real `prefect` CLI, and reading the server's
records (flow runs, task runs) through the Prefect client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from uuid import UUID

from tests.procutil import wait_until  # noqa: F401 (re-exported for the flow tests)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import noop_phases  # noqa: E402

from eagle3.process import procfs  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "gpu-node-0"  # the pool deployments/prefect.yaml names
PIPELINE = f"eagle3-pipeline/{POOL}"
BENCHMARK = f"eagle3-benchmark/{POOL}"
PHASES = ("datagen", "extract", "train", "bench")


def base_env() -> dict[str, str]:
    """This environment without any PREFECT_* from outside (the session must not touch a real server)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "EAGLE3_PHASE_TABLE"}


# `prefect worker start` answers its first SIGTERM or SIGINT only by signalling itself, and stays up;
# the second signal ends it at once ("Sending SIGKILL to the process worker"). Waiting long after the
# first only delays the teardown (15 s of every worker stop, 2026-12-03).
WORKER_STOP = ((signal.SIGTERM, 3.0), (signal.SIGINT, 10.0), (signal.SIGKILL, 10.0))


def stop_group(proc: subprocess.Popen, signals=((signal.SIGTERM, 20.0), (signal.SIGINT, 10.0),
                                                 (signal.SIGKILL, 10.0))) -> None:
    """End a process group this session started (leader = proc, started with start_new_session)."""
    stop_groups([proc], signals)


def stop_groups(procs: list[subprocess.Popen], signals=((signal.SIGTERM, 20.0), (signal.SIGINT, 10.0),
                                                        (signal.SIGKILL, 10.0))) -> None:
    """stop_group for several groups at once: each signal goes to every group still there, and the
    wait that follows is shared (two workers that each sit out SIGTERM cost one wait, not two)."""
    def gone(proc: subprocess.Popen) -> bool:
        proc.poll()
        return proc.returncode is not None and not procfs.group_members(proc.pid)

    for sig, wait_s in signals:
        left = [p for p in procs if not gone(p)]
        if not left:
            break
        for proc in left:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(gone(p) for p in left):
            time.sleep(0.1)
    for proc in procs:
        proc.poll()


def processes_with_env(key: str, value: str, exclude_pgids: set[int] = frozenset()) -> list:
    """Live processes whose environment has key=value (a value unique to the test that set it)."""
    return [info for info in procfs.all_procs()
            if not info.zombie and info.pid != os.getpid() and info.pgid not in exclude_pgids
            and procfs.environ_value(info.pid, key) == value]


def processes_with_home(home: Path, exclude_pgids: set[int] = frozenset()) -> list:
    return processes_with_env("PREFECT_HOME", str(home), exclude_pgids)


def end_leftovers(key: str, value: str, exclude_pgids: set[int] = frozenset()) -> list[int]:
    """End (by PID, after checking it is still that process) every live process whose environment has
    key=value: e.g. flow runs a worker started in their own process groups. Returns their PIDs."""
    ended = []
    for info in processes_with_env(key, value, exclude_pgids):
        try:
            if procfs.same_start(info.pid, info.start_ticks):
                os.kill(info.pid, signal.SIGKILL)
                ended.append(info.pid)
        except ProcessLookupError:
            pass
    return ended


def end_session_leftovers(home: Path, exclude_pgids: set[int] = frozenset()) -> list[int]:
    """Every process of a session's PREFECT_HOME (call only when nothing of it should run any more)."""
    return end_leftovers("PREFECT_HOME", str(home), exclude_pgids)


@dataclass
class PrefectServer:
    api_url: str
    home: Path
    env: dict[str, str]   # for every Prefect process of the session (clients, CLI, worker)
    log: Path
    proc: subprocess.Popen
    startup_s: float


def prefect_cli(server: PrefectServer, *args: str, timeout: float = 180, env: dict | None = None) -> str:
    """Run the real `prefect` CLI against the session server; returns its output, fails on rc != 0."""
    res = subprocess.run([PREFECT, *args], env=server.env | (env or {}), cwd=REPO, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"prefect {' '.join(args)} failed ({res.returncode}):\n{res.stdout[-3000:]}\n"
                             f"{res.stderr[-3000:]}")
    return res.stdout + res.stderr


# ---- helpers on the server's records ----------------------------------------------------------

def client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def submit(deployment: str, parameters: dict) -> UUID:
    with client() as c:
        dep = c.read_deployment_by_name(deployment)
        return c.create_flow_run_from_deployment(dep.id, parameters=parameters).id


def wait_final(run_ids, timeout: float = 240.0) -> dict:
    """Wait until every flow run is in a final state; returns {id: FlowRun}."""
    ids = list(run_ids)
    done: dict = {}
    with client() as c:
        def all_final():
            for rid in ids:
                if rid not in done:
                    run = c.read_flow_run(rid)
                    if run.state is not None and run.state.is_final():
                        done[rid] = run
            return len(done) == len(ids)

        wait_until(all_final, timeout, f"flow runs {ids} to finish", step=1.0)
    return done


def task_runs(flow_run_id: UUID, attempt: int | None = None) -> dict[str, object]:
    """Task runs of a flow run by name (phase names, handoff-after-*, preflight); `attempt` picks
    those of one flow-run attempt (flow_run_run_count)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with client() as c:
        runs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    out: dict[str, object] = {}
    for tr in sorted(runs, key=lambda r: r.created or datetime.min.replace(tzinfo=timezone.utc)):
        if attempt is None or tr.flow_run_run_count == attempt:
            out[tr.name] = tr
    return out


def phase_states(flow_run_id: UUID, attempt: int | None = None) -> dict[str, str]:
    trs = task_runs(flow_run_id, attempt)
    return {p: trs[p].state.name for p in PHASES if p in trs}


def config(tmp: Path, name: str, knobs: dict | None = None) -> tuple[str, Path]:
    """(config path, run dir) of a fresh no-op pipeline config."""
    path = noop_phases.write_noop_config(tmp, name=name, knobs=knobs)
    return str(path), tmp.resolve() / "run"


def params(config_path: str, **extra) -> dict:
    # The preflight doctor probes the real engines; the no-op phases have none to probe.
    return {"config_path": config_path, "doctor": False, **extra}


def run_logs(flow_run_id: UUID) -> list:
    """Every log record the server holds for a flow run (its tasks' included), oldest first. A flow run
    in this process hands its records to a background sender; drain it first, or the newest records
    (those of a run that just returned) may not have reached the server yet."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    with client() as c:
        return c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                           sort=LogSort.TIMESTAMP_ASC)


def run_artifacts(flow_run_id: UUID) -> dict[str, object]:
    """The artifacts of a flow run (its tasks' included) by key; key-less ones under their id."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with client() as c:
        found = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key or str(a.id): a for a in found}
