"""What an operator sees and gets on a real Prefect server (issue 16): the pack's own log records
in the run logs, run names that say which config and phases, phase parameters refused at
submission, a `prefect deploy` that refuses a missing EAGLE3_REPO, the benchmark table and report
in the UI (also when the phase came from the cache, and for a regression), compact handoff
artifacts, the failure alert of deployments/alerts.yaml firing its webhook, and an API key from a
Secret block (through the variable it fills) that reaches the server and is written nowhere.

Runs go through the session's server, deployments and worker (conftest.py) with the no-op phases,
except the API-key test, which runs the real datagen phase (a real vLLM server) in-process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from flowkit import (BENCHMARK, PIPELINE, PREFECT, REPO, client, config, params, phase_states, run_artifacts,
                     run_logs, submit, task_runs, wait_final, wait_until)
from noop_phases import counts

from tests.conftest import requires_engine, write_tiny_config
from tests.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PHASES = ("datagen", "extract", "train", "bench")


@pytest.fixture(scope="module")
def bench_runs(worker, tmp_path_factory):
    """A full pipeline whose stand-in bench writes a real report, then the same again (every phase
    Cached): both runs end with a bench result."""
    path, run_dir = config(tmp_path_factory.mktemp("ops"), "ops-view", {"bench_report": True})
    first = submit(PIPELINE, params(path))
    wait_final([first], timeout=300)
    second = submit(PIPELINE, params(path))
    runs = wait_final([second], timeout=300)
    with client() as c:
        return {"path": path, "run_dir": run_dir, "first": c.read_flow_run(first), "second": runs[second],
                "counts": counts(run_dir), "report": (run_dir / "bench" / "report.md").read_text()}


def test_pack_log_records_reach_the_run_logs_at_info(bench_runs):
    run = bench_runs["first"]
    assert run.state.is_completed(), run.state
    logs = wait_until(lambda: [r for r in run_logs(run.id) if r.name.startswith("eagle3.")] or None, 60,
                      "the pack's log records to reach the server")
    messages = [(r.name, r.level, r.message) for r in logs]
    for phase in PHASES:  # eagle3.phase_runner logs each phase's start and end, at INFO, inside its task run
        assert ("eagle3.phase_runner", 20, f"phase {phase}: starting (fresh)") in messages, messages
        assert any(n == "eagle3.phase_runner" and m.startswith(f"phase {phase}: done in ") for n, _, m in messages)
    assert all(r.task_run_id for r in logs), "records are attached to their task run"
    handoffs = [r.message for r in run_logs(run.id) if re.match(r"handoff [\w-]+-to-[\w-]+: GPUs free in ", r.message)]
    assert len(handoffs) == 5 and all("\n" not in m for m in handoffs), "one line per successful handoff"


def test_flow_run_names_carry_the_config_name_and_the_phases(bench_runs, worker):
    assert bench_runs["first"].name == "ops-view: datagen..bench"
    path = bench_runs["path"]
    only, forced = submit(PIPELINE, params(path, only="train")), submit(PIPELINE, params(path, from_="train",
                                                                                          force=["train"]))
    rerun = submit(BENCHMARK, params(path))
    runs = wait_final([only, forced, rerun], timeout=300)
    assert [runs[r].state.type.value for r in (only, forced, rerun)] == ["COMPLETED"] * 3
    assert runs[only].name == "ops-view: train"
    assert runs[forced].name == "ops-view: train..bench force train"
    assert runs[rerun].name == "ops-view: bench rerun"


def test_a_wrong_phase_is_refused_when_the_run_is_created(deployed, tmp_path):
    from prefect.exceptions import PrefectHTTPStatusError

    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    path, run_dir = config(tmp_path, "ops-typo")
    with client() as c:
        dep = c.read_deployment_by_name(PIPELINE)
        schema = dep.parameter_openapi_schema["properties"]
        for bad, typo in (({"only": "trian"}, "trian"), ({"from_": "Train"}, "Train"),
                          ({"force": ["extract", "bnech"]}, "bnech")):
            with pytest.raises(PrefectHTTPStatusError) as err:
                c.create_flow_run_from_deployment(dep.id, parameters=params(path, **bad))
            assert err.value.response.status_code == 409, err.value.response.text
            assert "Error creating flow run" in err.value.response.text and typo in err.value.response.text
        runs = c.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])), limit=200)
    assert not [r for r in runs if r.parameters.get("config_path") == path], "a flow run was created"
    assert not run_dir.exists()
    # The UI offers the phases as choices, with what each parameter does.
    assert schema["only"]["anyOf"][0]["enum"] == list(PHASES) == schema["from_"]["anyOf"][0]["enum"]
    assert schema["force"]["anyOf"][0]["items"]["enum"] == list(PHASES)
    assert "Run just this phase" in schema["only"]["description"]


@pytest.mark.parametrize("repo,message", [(None, "EAGLE3_REPO is not set"),
                                          ("relative/path", "is not an absolute path"),
                                          ("/nonexistent/eagle3", "is not a checkout of this pack")])
def test_deploy_refuses_a_missing_or_wrong_eagle3_repo(prefect_server, deployed, repo, message):
    env = {k: v for k, v in prefect_server.env.items() if k != "EAGLE3_REPO"} | ({"EAGLE3_REPO": repo} if repo else {})
    with client() as c:
        before = c.read_deployment_by_name(PIPELINE)
    res = subprocess.run([PREFECT, "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"], env=env,
                         cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "error: EAGLE3_REPO" in out and message in out and "EAGLE3_REPO=$(pwd) prefect deploy" in out, out
    assert "Traceback" not in out, "the message, not a traceback"
    with client() as c:
        after = c.read_deployment_by_name(PIPELINE)
    assert after.updated == before.updated and after.pull_steps == before.pull_steps, "the deployment was changed"


def _bench_artifacts(run_id, name: str = "ops-view") -> tuple[list, str]:
    """(table rows, report markdown) the run published."""
    arts = run_artifacts(run_id)
    table, report = arts.get(f"{name}-bench-table"), arts.get(f"{name}-bench-report")
    assert table is not None and report is not None, sorted(arts)
    return (json.loads(table.data) if isinstance(table.data, str) else table.data), report.data


def test_bench_table_and_report_are_in_the_ui_also_when_the_phase_came_from_the_cache(bench_runs):
    first, second = bench_runs["first"], bench_runs["second"]
    assert second.state.is_completed(), second.state
    assert phase_states(second.id) == dict.fromkeys(PHASES, "Cached")
    assert bench_runs["counts"] == dict.fromkeys(PHASES, 1), "the second run ran no phase body"
    for run in (first, second):
        rows, md = _bench_artifacts(run.id)
        assert [(r["config"], r["concurrency"]) for r in rows] == [(c, n) for c in ("baseline", "k=1", "k=3")
                                                                   for n in (1, 4)]
        assert "| k=3 | 1 | 180.0 | 1.80× |" in md
        assert md.startswith(bench_runs["report"]), "the report's own text, not a link to the node"
        assert "file://" not in md
    handoffs = [a for k, a in run_artifacts(first.id).items() if "-handoff-" in k]
    assert len(handoffs) == 5 and all(a.type == "markdown" for a in handoffs), "one artifact per handoff"
    assert all(a.data.startswith("**GPU handoff ") and "<details>" in a.data for a in handoffs)


# ---- alerts -----------------------------------------------------------------------------------------

class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body or b"{}"))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    """A local HTTP listener standing in for Slack/e-mail: what the notification block POSTs."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), type("Hook", (_Hook,), {"received": []}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _install_alerts(prefect_server, block: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "deployments" / "install_alerts.py"), "--block", block],
                          env=prefect_server.env, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)


def test_failure_alert_fires_for_a_failed_run_and_a_benchmark_regression(prefect_server, worker, webhook, tmp_path):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = f"eagle3-alerts-{uuid.uuid4().hex[:8]}"
    CustomWebhookNotificationBlock(name="hook", url=f"http://127.0.0.1:{webhook.server_port}/alert",
                                   json_data={"subject": "{{subject}}", "body": "{{body}}"}).save(block)
    bad = _install_alerts(prefect_server, f"custom-webhook/{block}-missing")
    assert bad.returncode == 2 and "no custom-webhook block named" in bad.stderr, bad.stderr
    res = _install_alerts(prefect_server, f"custom-webhook/{block}")
    assert res.returncode == 0, res.stdout + res.stderr
    again = _install_alerts(prefect_server, f"custom-webhook/{block}")  # re-installing replaces, never duplicates
    assert again.returncode == 0, again.stderr
    with client() as c:
        (automation,) = c.read_automations_by_name("eagle3-run-failed")
    try:
        # Every bench call of this config measures a regression (acceptance below the floor).
        regressed, _ = config(tmp_path / "r", "ops-regress", {"bench_report": True, "fail": {"bench": "gate"}})
        ok, _ = config(tmp_path / "ok", "ops-fine")
        ids = {"pipeline": submit(PIPELINE, params(regressed)),
               "completed": submit(PIPELINE, params(ok, only="datagen"))}
        runs = wait_final(ids.values(), timeout=300)
        ids["benchmark"] = submit(BENCHMARK, params(regressed))  # the nightly rerun, upstream phases now done
        runs |= wait_final([ids["benchmark"]], timeout=300)
        assert runs[ids["pipeline"]].state.is_failed() and runs[ids["benchmark"]].state.is_failed()
        assert phase_states(ids["benchmark"]) == {"bench": "Failed"}
        assert runs[ids["completed"]].state.is_completed()

        def alerts_for(run_id):
            return [m for m in webhook.RequestHandlerClass.received if str(run_id) in m.get("body", "")]

        for key in ("pipeline", "benchmark"):
            (msg,) = wait_until(lambda: alerts_for(ids[key]) or None, 120, f"the alert for the {key} run")
            run = runs[ids[key]]
            assert msg["subject"] == f"eagle3: flow run {run.name} Failed", msg
            assert "gate failed on purpose" in msg["body"] and "deployment gpu-node-0" in msg["body"], msg
        time.sleep(5)  # the completed run would have alerted by now
        assert not alerts_for(ids["completed"])
        assert len(alerts_for(ids["pipeline"])) == 1, "one alert per failed run"
        # The regression's numbers are in the UI even though the run failed.
        rows, md = _bench_artifacts(ids["benchmark"], "ops-regress")
        assert len(rows) == 6 and "Acceptance gate** (failed)" in md
    finally:
        with client() as c:
            c.delete_automation(automation.id)


def test_a_scheduled_rerun_fails_only_on_a_decided_regression_never_on_drift(worker, tmp_path):
    """Through the deployment a cron schedule runs (the worker, flows/benchmark.py): an engine regression the
    watch decided fails the flow run, whose failure is the alert; node drift and undecided figures are in the
    artifacts and the run completes (eagle3/bench/watch.py decides which is which: tests/test_benchwatch.py)."""
    runs = {}
    for verdict in ("engine regression", "node drift", "undecided"):
        path, _ = config(tmp_path / verdict.replace(" ", "-"), f"ops-{verdict.split()[0]}",
                         {"bench_report": True, "bench_watch": verdict})
        wait_final([submit(PIPELINE, params(path))], timeout=300)  # the pipeline first: the rerun follows it
        runs[verdict] = submit(BENCHMARK, params(path))
    final = wait_final(runs.values(), timeout=300)
    failed = final[runs["engine regression"]].state
    assert failed.is_failed() and "benchmark engine regression: engine regression (a stand-in's verdict)" in failed.message
    assert phase_states(runs["engine regression"]) == {"bench": "Completed"}  # the phase itself passed
    for verdict in ("node drift", "undecided"):
        assert final[runs[verdict]].state.is_completed(), (verdict, final[runs[verdict]].state)


# ---- API keys ---------------------------------------------------------------------------------------

@requires_engine
@pytest.mark.engine
def test_api_key_from_a_secret_block_reaches_the_server_and_is_written_nowhere(prefect_server, tiny_model, tmp_path,
                                                                               monkeypatch):
    """The real datagen phase through the pipeline flow (in-process, against the session server):
    the key from the Secret block, which fills the variable api_key_env names (unset beforehand),
    is what the vLLM server enforces (401 without it, 200 with it, while the phase runs); afterwards
    it is in no file under run_dir, no log record and no artifact of the run. Past the fill, a key
    from that variable takes the same path (test_api_key_sources.py: the variable is where
    Server.key() reads it; tests/reliability/test_security.py: a key from the config and the run's own)."""
    import httpx
    from prefect.blocks.system import Secret

    from eagle3.phases import datagen as datagen_phase
    from flows.pipeline import eagle3_pipeline

    key, var = f"sk-eagle3-{uuid.uuid4().hex}", f"EAGLE3_TEST_KEY_{uuid.uuid4().hex[:8].upper()}"
    block = f"eagle3-test-key-{uuid.uuid4().hex[:8]}"
    Secret(value=key).save(block)
    assert var not in os.environ
    fields = {"api_key_env": var, "api_key_secret_block": block}
    port = free_port()
    cfg = write_tiny_config(tmp_path, {"datagen": {"max_samples": 4, "concurrency": 2, "sampling": {"max_tokens": 8},
                                                   "server": {"port": port, **fields}},
                                       "extract": {"server": {"port": free_port()}},
                                       "bench": {"server": {"port": free_port()}}})
    seen: dict = {}
    real_generate = datagen_phase._generate

    async def generate_after_probing(cfg_, url, *args, **kwargs):
        # The server is up and the phase about to use it: ask it without and with the key first
        # (a probing thread could miss the sub-second window the tiny model leaves).
        async with httpx.AsyncClient(timeout=10) as http:
            seen["without key"] = (await http.get(f"{url}/v1/models")).status_code
            seen["with key"] = (await http.get(f"{url}/v1/models",
                                               headers={"Authorization": f"Bearer {key}"})).status_code
        return await real_generate(cfg_, url, *args, **kwargs)

    monkeypatch.setattr(datagen_phase, "_generate", generate_after_probing)
    try:
        state = eagle3_pipeline(config_path=str(tmp_path / "config.yaml"), only="datagen", doctor=False,
                                return_state=True)
    finally:
        os.environ.pop(var, None)
    assert state.is_completed(), state
    assert seen == {"without key": 401, "with key": 200}
    samples = cfg.run_dir / "datagen" / "samples.jsonl"
    assert len(samples.read_text().splitlines()) == 4, "generated with the key"
    files = [f for f in cfg.run_dir.rglob("*") if f.is_file()]
    assert any(f.name == "vllm-server.log" for f in files) and any("prefect-results" in str(f) for f in files)
    assert not [str(f) for f in files if key.encode() in f.read_bytes()], "the key was written under run_dir"
    run_id = state.state_details.flow_run_id
    logs = run_logs(run_id)
    assert any(r.name.startswith("eagle3.") for r in logs)
    assert not [r.message for r in logs if key in r.message], "the key is in a log record"
    assert not [k for k, a in run_artifacts(run_id).items() if key in json.dumps(a.data)], "the key is in an artifact"
    with client() as c:
        assert key not in json.dumps(c.read_flow_run(run_id).parameters)


@pytest.mark.parametrize("fields,message", [
    ({"api_key_env": "EAGLE3_TEST_NEVER_SET", "api_key_secret_block": "eagle3-no-such-block"},
     "datagen.server.api_key_secret_block: no Secret block named 'eagle3-no-such-block'"),
    ({"api_key_env": "EAGLE3_TEST_NEVER_SET"}, "datagen.server.api_key_env: environment variable "
                                               "EAGLE3_TEST_NEVER_SET is not set"),
])
def test_a_missing_key_source_fails_the_run_before_the_first_handoff(prefect_server, tmp_path, fields, message):
    import yaml

    from flows.pipeline import eagle3_pipeline

    path, run_dir = config(tmp_path, "ops-nokey")
    raw = yaml.safe_load(open(path))
    raw["datagen"]["server"].update(fields)
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    os.environ.pop("EAGLE3_TEST_NEVER_SET", None)
    state = eagle3_pipeline(config_path=path, doctor=False, return_state=True)
    assert state.is_failed() and message in state.message, state.message
    assert "handoff-after-start" not in task_runs(state.state_details.flow_run_id), "failed before the first handoff"
    assert not (run_dir / "handoffs").exists()
