"""The scheduled benchmark's flow (flows/benchmark.py: what the cron deployment runs) re-measures
for real and is judged against the run dir's history: a drafter regression ends the flow run Failed
with the cause (so the failure alert of deployments/alerts.yaml fires, tests/flows/test_operator_view.py),
and the trend is published.

Real parts: the session's Prefect server, the flow in-process, the real bench phase with two vLLM
CPU servers (baseline and k=3 with the trained fixture drafter); the phases before it are no-op
stand-ins that only leave their done markers. The history holds one earlier run: the first recorded run of
tests/fixtures/bench-history (same target, drafter, prompts, sampling) with its acceptance doubled
and an older engine version, i.e. a last good run that accepted more under another engine."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from flowkit import run_artifacts

from eagle3.bench.watch import read_history
from eagle3.fsio import atomic_write_json
from tests.conftest import requires_engine, write_tiny_config
from tests.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.engine, requires_engine, pytest.mark.timeout(900)]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _better_reference(cfg) -> tuple[str, dict]:
    name, first = read_history(FIXTURES / "bench-history")[0]
    ref = copy.deepcopy(first)
    ref["target"]["model"] = str(cfg.target.model)  # recorded on another checkout path
    ref["engine_version"] = "0.31.0"
    for server in ref["servers"]:
        for w in server["windows"] if server["k"] else []:
            acc = w["acceptance"]
            acc["per_position"] = [min(1.0, 2 * p) for p in acc["per_position"]]
            acc["acceptance_length"] = 1 + sum(acc["per_position"])
    return name, ref


def test_the_benchmark_flow_fails_on_a_drafter_regression_naming_the_engine_change(prefect_server, tmp_path):
    from eagle3 import phase_runner, phase_table
    from flows.benchmark import eagle3_benchmark

    cfg = write_tiny_config(tmp_path, {"target": {"model": str(FIXTURES / "eagle3-tiny" / "target")}, "bench": {
        "server": {"port": free_port()}, "drafter": str(FIXTURES / "eagle3-tiny" / "drafter-trained"),
        "drafter_trained": True, "num_speculative_tokens": [3], "concurrency": [4], "num_prompts": 16,
        "max_tokens": 64, "warmup_prompts": 2, "temperature": 0.0}})
    name, ref = _better_reference(cfg)
    history = cfg.run_dir / "bench-history"
    atomic_write_json(history / name, ref)

    # A rerun follows a finished pipeline: its first three phases here are the no-op stand-ins
    # (tests/flows/noop_phases.py), which leave the done markers the bench phase requires.
    with phase_table.using(phase_table.with_runs({p: f"noop_phases:{p}" for p in ("datagen", "extract", "train")})):
        for phase in ("datagen", "extract", "train"):
            phase_runner.run_phase(cfg, phase)

    state = eagle3_benchmark(config_path=str(tmp_path / "config.yaml"), doctor=False, return_state=True)
    assert state.is_failed(), state
    assert "benchmark regression: drafter regression against the last good run " + name in state.message
    assert "engine version 0.31.0 -> 0.32.0" in state.message and "k=3 c=4 acceptance_length" in state.message
    results = json.loads((cfg.run_dir / "bench" / "results.json").read_text())
    assert results["watch"]["status"] == "drafter regression" and results["watch"]["reference"]["file"] == name
    assert len(list(history.glob("*.json"))) == 2
    artifacts = run_artifacts(state.state_details.flow_run_id)
    trend = next(a for key, a in artifacts.items() if key.endswith("bench-trend"))
    assert "| 2 |" in trend.data and "drafter regression |" in trend.data
