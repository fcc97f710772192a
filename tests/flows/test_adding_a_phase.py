"""Adding a phase is one module plus one table row: standin_phase.py declares a phase after bench,
the fixture adds its row, and both the flow (in process, on the session's real Prefect server) and
`eagle3 run` (a subprocess with its own embedded server) run it with no other change: a GPU handoff
before and after it, a DONE marker chained to bench's output, a Prefect task run, and a line in
`eagle3 status`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import standin_phase
from flowkit import PHASES, base_env, config, end_session_leftovers, params, task_runs
from noop_phases import counts

from eagle3 import phase_table

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
HERE = Path(__file__).resolve().parent


@pytest.fixture
def added_phase(monkeypatch):
    """The no-op pipeline plus the stand-in row: in this process through phase_table.using, in the
    processes the test starts through EAGLE3_PHASE_TABLE (read when they ask for the table)."""
    monkeypatch.setenv(phase_table.TABLE_ENV, f"{standin_phase.__name__}:TABLE")
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    with phase_table.using(standin_phase.TABLE) as table:
        yield table


def assert_digest_done(run_dir: Path) -> dict:
    marker = json.loads((run_dir / "state" / "digest.done.json").read_text())
    bench = json.loads((run_dir / "state" / "bench.done.json").read_text())
    assert marker["upstream"] == bench["fingerprint"], "the new phase consumed bench's output"
    assert (run_dir / "digest" / "digest.txt").read_text().strip() == marker["summary"]["details"]["digest"]
    assert counts(run_dir) == dict.fromkeys(PHASES, 1)
    return marker


def status_of(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([EAGLE3, "status", str(run_dir)], capture_output=True, text=True, timeout=120)


def test_the_flow_runs_an_added_phase_between_handoffs(prefect_server, added_phase, tmp_path):
    from flows.pipeline import eagle3_pipeline

    path, run_dir = config(tmp_path, "added-phase-flow")
    state = eagle3_pipeline(**params(path), return_state=True)
    assert state.is_completed(), state.message
    runs = task_runs(state.state_details.flow_run_id)
    assert runs["digest"].state.name == "Completed"
    handoffs = sorted(name for name in runs if name.startswith("handoff-after-"))
    assert handoffs == sorted(f"handoff-after-{p}" for p in ("start", *PHASES, "digest"))
    reports = {json.loads(f.read_text())["label"] for f in (run_dir / "handoffs").glob("*.json")}
    assert {"bench-to-digest", "digest-to-end"} <= reports
    assert_digest_done(run_dir)
    shown = status_of(run_dir)
    assert shown.returncode == 0, shown.stderr
    assert "digest" in shown.stdout and "done" in shown.stdout.split("digest", 1)[1].splitlines()[0]


def test_eagle3_run_runs_an_added_phase(added_phase, tmp_path):
    home = tmp_path / "prefect-home"
    path, run_dir = config(tmp_path, "added-phase-cli")
    env = base_env() | {"PREFECT_HOME": str(home), phase_table.TABLE_ENV: f"{standin_phase.__name__}:TABLE",
                        "PYTHONPATH": str(HERE)}
    try:
        res = subprocess.run([EAGLE3, "run", path, "--no-doctor"], env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=500)
    finally:
        end_session_leftovers(home)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert "done digest" in res.stdout
    marker = assert_digest_done(run_dir)
    assert marker["summary"]["details"]["of"].endswith("bench/output.txt")
    reports = {json.loads(f.read_text())["label"] for f in (run_dir / "handoffs").glob("*.json")}
    assert {"bench-to-digest", "digest-to-end"} <= reports
    shown = status_of(run_dir)
    assert shown.returncode == 0, shown.stderr
    assert "digest" in shown.stdout
    # Only the selected table knows the phase: without it the CLI refuses the name, naming the choices.
    plain = subprocess.run([EAGLE3, "run", path, "--only", "digest"], env=base_env(), capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 2 and "unknown phase 'digest'; choose from datagen, extract, train, bench" in plain.stderr
