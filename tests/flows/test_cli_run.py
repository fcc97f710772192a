"""`eagle3 run` drives the pipeline flow in-process on Prefect's embedded (ephemeral) server when no
PREFECT_API_URL is set: a cold start on a fresh PREFECT_HOME must fit its raised start-up timeout
on a small machine. The run's records are read back from the embedded server's own database."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flowkit import PHASES, base_env, end_session_leftovers, processes_with_home
from noop_phases import counts, overrides_env, write_noop_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")


def test_eagle3_run_on_the_embedded_server(tmp_path):
    home = tmp_path / "prefect-home"
    path = write_noop_config(tmp_path / "cfg", name="cli-embedded")
    run_dir = path.parent / "run"
    env = base_env() | overrides_env() | {"PREFECT_HOME": str(home)}  # no PREFECT_API_URL: embedded server
    t0 = time.monotonic()
    try:
        res = subprocess.run([EAGLE3, "run", str(path), "--no-doctor"], env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=500)
        took = time.monotonic() - t0
        # The embedded server was a subprocess of the command: nothing of it may outlive it.
        time.sleep(1)
        left = [(p.pid, p.comm) for p in processes_with_home(home)]
    finally:
        end_session_leftovers(home)
    assert not left, f"processes of the run outlived `eagle3 run`: {left}"
    assert res.returncode == 0, f"rc {res.returncode} after {took:.0f} s:\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
    # One Prefect server, the run's own (registered, ended with the run); Prefect starts none of its own.
    assert "Starting temporary server" not in res.stdout + res.stderr
    # The server's wait ends with its own line, before the flow begins: on the H200 a wait for something else
    # that followed it went on showing as the server's (bench/RESULTS.md, 2026-12-05).
    text = res.stdout + res.stderr
    answered = text.find("the run's Prefect server answered after ")
    assert 0 <= answered < text.find("Beginning flow run"), text[-3000:]
    assert "Error logging to API" not in res.stdout + res.stderr, "the run's last logs reach its server before it stops"
    for phase in PHASES:
        assert f"done {phase}" in res.stdout
    assert counts(run_dir) == dict.fromkeys(PHASES, 1)
    # Private by default: the run dir `eagle3 run` made, its state and the owner token (docs/security.md).
    assert [os.stat(p).st_mode & 0o777 for p in (run_dir, run_dir / "state", run_dir / "state" / "owner-token")] \
        == [0o700, 0o700, 0o600]

    db = sqlite3.connect(home / "prefect.db")
    try:
        flows = db.execute("select f.name, r.state_type from flow_run r join flow f on r.flow_id = f.id").fetchall()
        tasks = dict(db.execute("select name, state_name from task_run").fetchall())
    finally:
        db.close()
    assert flows == [("eagle3-pipeline", "COMPLETED")]
    assert {p: tasks[p] for p in PHASES} == dict.fromkeys(PHASES, "Completed")
    assert sum(1 for name in tasks if name.startswith("handoff-after-")) == len(PHASES) + 1


def test_a_failure_is_said_once_with_its_cause_and_its_fix(tmp_path):
    """The preflight doctor refuses (the stand-in model dir has no weights): the check's own line and
    the run's last line name the cause, each once, with one fix; no traceback, no restatement by
    Prefect's engine on the console; `eagle3 status` names the step and the cause."""
    home = tmp_path / "prefect-home"
    path = write_noop_config(tmp_path / "cfg", name="cli-refused")
    env = base_env() | overrides_env() | {"PREFECT_HOME": str(home)}
    try:
        res = subprocess.run([EAGLE3, "run", str(path)], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=500)
    finally:
        end_session_leftovers(home)
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-4000:]
    cause = "has config.json but no weight files"
    assert text.count(cause) == 2, text[-6000:]  # the doctor's line for the check, and the run's last line
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    assert last.startswith("error: pipeline cli-refused ended FAILED in preflight: DoctorFailed: preflight failed: "
                           "model-files: ") and cause in last, last
    assert last.count("fix:") == 1 and "more failed check(s), each logged with its fix" in last
    assert "Traceback" not in text and "Finished in state Failed" not in text, text[-6000:]
    assert counts(path.parent / "run") == dict.fromkeys(PHASES, 0), "no phase ran"
    shown = subprocess.run([EAGLE3, "status", str(path.parent / "run")], capture_output=True, text=True, timeout=60)
    error = next(line for line in shown.stdout.splitlines() if line.startswith("error"))
    assert "preflight: DoctorFailed: preflight failed: model-files:" in error and cause in error, shown.stdout


COUNTER = '''import os
log = os.environ.get("EAGLE3_TEST_VALIDATIONS")
if log:
    import eagle3.config.loading as loading
    validate = loading.parse_config

    def counted(*args, **kwargs):
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {kwargs.get('source', '')}\\n")
        return validate(*args, **kwargs)

    loading.parse_config = counted
'''


def test_one_eagle3_run_validates_its_config_once(tmp_path):
    """Issue 56: the config is validated at the entry point; the flow, the pin, every task and handoff get
    that model (the pinned copy is registered with it), a rerun's pin compares fingerprints from the last
    copy's header. Every validation in every process of the run is counted (a sitecustomize on its path)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(COUNTER)
    path = write_noop_config(tmp_path / "cfg", name="cli-loads")
    log = tmp_path / "validations.log"
    env = base_env() | overrides_env() | {"PREFECT_HOME": str(tmp_path / "prefect-home"),
                                          "EAGLE3_TEST_VALIDATIONS": str(log)}
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env["PYTHONPATH"]])
    try:
        for run in ("first", "rerun"):
            log.unlink(missing_ok=True)
            res = subprocess.run([EAGLE3, "run", str(path), "--no-doctor"], env=env, stdin=subprocess.DEVNULL,
                                 capture_output=True, text=True, timeout=500)
            assert res.returncode == 0, f"{run}: {res.stdout[-2000:]}\n{res.stderr[-3000:]}"
            lines = log.read_text().splitlines()
            assert len(lines) == 1 and lines[0].endswith(str(path)), f"{run}: validations {lines}"
    finally:
        end_session_leftovers(tmp_path / "prefect-home")
