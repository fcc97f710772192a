"""A forced redo that is killed leaves its phase "not done", never "done" over half-deleted output.

Issue 24 found `eagle3 extract --force` wiping the hidden states and then being killed, after which
`eagle3 status` said "extract done" and `eagle3 run --from train` went ahead with nothing to train
on. Every phase command now runs through eagle3.phase_runner.run_phase, which removes the DONE marker
before any output, and a phase is done only while the outputs its table row names exist.

The phase bodies are the instant stand-ins of tests/flows/noop_phases.py (each row: the real
row with the stand-in function and its one output, output.txt); the commands, the markers and the CLI are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3 import phase_table
from eagle3.config import load_config
from eagle3.phase_runner import is_done, run_phase
from eagle3.process import procfs
from tests.procutil import wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "flows"))
import noop_phases  # noqa: E402

pytestmark = pytest.mark.timeout(300)

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
PHASES = ("datagen", "extract", "train", "bench")


def _eagle3(*args, env, timeout=120, **kw):
    return subprocess.run([EAGLE3, *args], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture
def done_run(tmp_path):
    """A run dir where every stand-in phase is done, and the environment that selects the stand-ins."""
    path = noop_phases.write_noop_config(tmp_path, name="forced-redo")
    (tmp_path / "run").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | noop_phases.overrides_env()
    with phase_table.using(noop_phases.TABLE):
        cfg = load_config(path)
        for phase in PHASES:
            run_phase(cfg, phase)
    return path, cfg, env


@pytest.mark.parametrize("phase", PHASES)
def test_a_killed_forced_redo_leaves_the_phase_not_done(done_run, phase):
    path, cfg, env = done_run
    (cfg.run_dir / "knobs.json").write_text(json.dumps({"sleep": {phase: 60}}))
    proc = subprocess.Popen([EAGLE3, phase, str(path), "--force"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        # the redo's body is running (its second call): the old output is already gone
        wait_until(lambda: len(noop_phases.calls(cfg.run_dir, phase)) == 2, timeout=60, what=f"{phase} redo started")
        assert not (cfg.phase_dir(phase) / "output.txt").exists()
        os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: the worst interruption there is
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    wait_until(lambda: not procfs.group_members(proc.pid), timeout=10, what="the killed command's group gone")
    assert not cfg.layout.done_marker(phase).exists(), "the marker went before the output"
    shown = _eagle3("status", str(cfg.run_dir), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["phases"][phase]["done"] is False
    after = phase_table.next_phase(phase)
    (cfg.run_dir / "knobs.json").unlink()
    if after:
        refused = _eagle3(after, str(path), env=env)
        assert refused.returncode == 2, refused.stderr
        assert f"phase '{after}' needs '{phase}' finished" in refused.stderr
        assert len(noop_phases.calls(cfg.run_dir, after)) == 1, "the downstream phase did not run again"
    rerun = _eagle3(phase, str(path), env=env)  # without --force: the interrupted redo is done now
    assert rerun.returncode == 0, rerun.stderr
    assert cfg.layout.done_marker(phase).exists() and (cfg.phase_dir(phase) / "output.txt").exists()


def test_a_marker_without_its_named_outputs_is_not_done(done_run):
    """The real pipeline's rows name their outputs; a marker whose output was deleted vouches for nothing."""
    path, cfg, env = done_run
    with phase_table.using(noop_phases.TABLE):
        assert all(is_done(cfg, p) for p in PHASES)
        (cfg.phase_dir("extract") / "output.txt").unlink()
        assert not is_done(cfg, "extract") and is_done(cfg, "datagen")
    shown = _eagle3("status", str(path), env=env)
    line = next(x for x in shown.stdout.splitlines() if x.startswith("extract"))
    assert "not done: its output is gone (output.txt missing" in line, shown.stdout
    assert [p.outputs for p in phase_table.PIPELINE] == [("samples.jsonl",), ("manifest.json",), ("manifest.json",),
                                                         ("results.json", "report.md")]

