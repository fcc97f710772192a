"""A cancelled or crashed pipeline run ends what it started. Prefect only signals the flow-run
process (the process worker kills that process group); a service the pipeline launched lives in
its own session, out of that group's reach, so ending it is the supervised-services layer's job:
the phase's own cleanup on cancellation, and the flow's on_crashed teardown hook when the flow
process itself was killed (nothing of it left to clean up)."""

from __future__ import annotations

import json
import os
import signal

import pytest
from flowkit import PIPELINE, client, config, params, phase_states, submit, wait_final, wait_until
from noop_phases import counts

from eagle3.process import procfs
from eagle3.process.services import Supervisor, state_dir_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def teardown_logs(rid) -> list[str]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with client() as c:
        logs = c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[rid])))
    return [log.message for log in logs if log.message.startswith("teardown on ")]


def start_with_service(name: str, tmp_path):
    path, run_dir = config(tmp_path / name, name, {"child": ["datagen"]})
    rid = submit(PIPELINE, params(path))
    child_file = run_dir / "datagen" / "child.json"
    wait_until(child_file.exists, 300, "the datagen phase to start its service")
    child = json.loads(child_file.read_text())
    assert procfs.same_start(child["pid"], child["start_ticks"]), "the service runs"
    return rid, run_dir, child


def test_cancel_stops_the_services_the_run_started(worker, tmp_path):
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    rid, run_dir, child = start_with_service("cancel-e", tmp_path)
    assert procfs.read_stat(child["pid"]).pgid != procfs.read_stat(procfs.read_stat(child["pid"]).ppid).pgid, \
        "the service is in its own process group, beyond the reach of the worker's group kill"

    with client() as c:  # = `prefect flow-run cancel <id>`
        c.set_flow_run_state(rid, State(type=StateType.CANCELLING))
    run = wait_final([rid], timeout=180)[rid]

    assert run.state.is_cancelled(), run.state
    wait_until(lambda: not procfs.same_start(child["pid"], child["start_ticks"]), 30, "the service to be gone")
    assert Supervisor(state_dir_for(run_dir)).registry.entries() == [], "the registry still lists services"
    assert phase_states(rid)["datagen"] in ("Crashed", "Cancelled", "Failed")
    wait_until(lambda: teardown_logs(rid), 60, "the on_cancellation teardown hook to report")
    assert counts(run_dir)["extract"] == 0, "nothing ran after the cancelled phase"


def test_crash_of_the_flow_process_runs_the_teardown_hook(worker, prefect_server, tmp_path):
    rid, run_dir, child = start_with_service("crash-f", tmp_path)
    flow_pid = procfs.read_stat(child["pid"]).ppid  # the flow-run process launched the service
    assert procfs.environ_value(flow_pid, "PREFECT_HOME") == str(prefect_server.home), "a flow run of this session"
    os.kill(flow_pid, signal.SIGKILL)  # no finally, no hook in that process: it is just gone

    run = wait_final([rid], timeout=180)[rid]
    assert run.state.is_crashed(), run.state
    wait_until(lambda: not procfs.same_start(child["pid"], child["start_ticks"]), 60,
               "the on_crashed teardown to stop the orphaned service")
    assert Supervisor(state_dir_for(run_dir)).registry.entries() == [], "the registry still lists services"
    (report,) = wait_until(lambda: teardown_logs(rid), 60, "the on_crashed teardown hook to report")
    assert report.startswith("teardown on Crashed: 1 registered service(s) stopped; datagen-child"), report
    assert "clean" in report
