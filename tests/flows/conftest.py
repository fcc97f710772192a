"""Real Prefect parts for the flow tests: one `prefect server start` per session (SQLite in an
isolated PREFECT_HOME, loopback only, analytics off), the GPU pool and deployments created from
deployments/prefect.yaml with `prefect deploy`, and one `prefect worker start` on that pool. Phases
are the instant ones of noop_phases.py (through EAGLE3_PHASE_TABLE in the worker's
environment, which its flow-run processes inherit).

Every process here is started by the session, in its own process group, and stopped by that
group's id at teardown. Flow-run processes the worker started (their own groups) are found by the
session's unique PREFECT_HOME in their environment and ended by PID."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import noop_phases  # noqa: E402
from flowkit import (POOL, REPO, PREFECT, WORKER_STOP, PrefectServer, base_env, end_session_leftovers,  # noqa: E402
                     prefect_cli, stop_group, wait_until)

from eagle3.process import procfs  # noqa: E402
from tests.ports import free_port  # noqa: E402


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    from prefect.settings import (PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_ANALYTICS_ENABLED,
                                  temporary_settings)

    home = tmp_path_factory.mktemp("prefect-home")
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = base_env() | {
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
        "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "2",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_CLI_COLORS": "false",
        "PREFECT_CLI_WRAP_LINES": "false",
    }
    log = home / "server.log"
    t0 = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                                 "--analytics-off"], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    try:
        import httpx

        def healthy():
            if proc.poll() is not None:
                raise AssertionError(f"prefect server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                return httpx.get(f"{api_url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 240, "the Prefect server to become healthy", step=0.5)
        server = PrefectServer(api_url, home, env, log, proc, time.monotonic() - t0)
        with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_HOME: str(home),
                                         PREFECT_SERVER_ANALYTICS_ENABLED: False}):
            try:
                yield server
            finally:
                from prefect.logging.handlers import APILogHandler

                # The tests' last log records, while the server still answers and is still the
                # configured API: flushed outside these settings, they would start Prefect's own
                # temporary server, stopped at interpreter exit after pytest closed its streams.
                APILogHandler().flush()
    finally:
        stop_group(proc)
        assert proc.returncode is not None, "prefect server did not exit"
        assert not procfs.group_members(proc.pid), "prefect server processes survived"


@pytest.fixture(scope="session")
def deployed(prefect_server):
    """The process pool `gpu-node-0` with concurrency limit 1, and both deployments of
    deployments/prefect.yaml created by `prefect deploy --all` from the repo root."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        # = `prefect work-pool create gpu-node-0 --type process` + `set-concurrency-limit gpu-node-0 1`
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process", concurrency_limit=1,
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
    t0 = time.monotonic()
    out = prefect_cli(prefect_server, "deploy", "--all", "--prefect-file", "deployments/prefect.yaml",
                      env={"EAGLE3_REPO": str(REPO)})
    return {"deploy_s": time.monotonic() - t0, "output": out}


@dataclass
class Worker:
    proc: subprocess.Popen
    log: Path


@pytest.fixture(scope="session")
def worker(prefect_server, deployed, tmp_path_factory):
    """`prefect worker start --pool gpu-node-0` (no --limit: the pool's limit is what is under test)."""
    log = prefect_server.home / "worker.log"
    env = prefect_server.env | noop_phases.overrides_env()
    with open(log, "ab") as out:
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", POOL, "--type", "process"], env=env,
                                cwd=tmp_path_factory.mktemp("worker-cwd"), stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    try:
        wait_until(lambda: "started!" in log.read_text() or proc.poll() is not None, 120, "the worker to start")
        assert proc.poll() is None, f"worker exited:\n{log.read_text()[-3000:]}"
        yield Worker(proc, log)
    finally:
        stop_group(proc, WORKER_STOP)
        leftovers = end_session_leftovers(prefect_server.home, exclude_pgids={prefect_server.proc.pid})
        assert proc.returncode is not None, "prefect worker did not exit"
        assert not leftovers, f"flow-run processes outlived the tests: {leftovers}"


