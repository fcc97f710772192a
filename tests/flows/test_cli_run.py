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
