"""Benchmark rerun: the benchmark phase alone, with its handoffs, against the latest trained
drafter; made for a cron schedule (see deployments/)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from prefect.runtime import flow_run

from flows.pipeline import run_name, run_phases, teardown


def benchmark_run_name() -> str:
    return run_name((flow_run.parameters or {}).get("config_path"), ["bench"]) + " rerun"


@flow(name="eagle3-benchmark", flow_run_name=benchmark_run_name, on_crashed=[teardown], on_cancellation=[teardown])
def eagle3_benchmark(config_path: str, doctor: bool = True, lease_wait_s: float = 0.0) -> dict:
    """Re-measure: serve baseline and target+drafter again and record a fresh result, compared with
    the run dir's bench-history (eagle3/bench/watch.py). Fails (and so fires the failure alert of
    deployments/alerts.yaml) only on a decided regression: of the drafter (the bench phase fails, as in
    every run) or of the engine (this flow fails: a scheduled rerun is how an engine upgrade is caught),
    named with what changed since the last good run; a gate fails it too. Node drift and undecided
    figures are reported in the run's artifacts and never fail it.

    Args:
        config_path: Pipeline config (YAML); a relative path resolves against the repo root on the node.
        doctor: Run the preflight doctor first.
        lease_wait_s: If another run holds the run dir or its GPUs, wait up to this many seconds for it,
            then fail naming it (0: fail at once).
    """
    results = run_phases(str(Path(config_path).resolve()), ["bench"], force=["bench"], doctor=doctor,
                         lease_wait_s=lease_wait_s)
    details = results["bench"].get("summary", {}).get("details", {})
    if details.get("watch") == "engine regression" and details.get("fail_on_regression", True):
        raise EngineRegression(f"benchmark engine regression: {details['watch_message']}.\nAll numbers: "
                               f"{details.get('results')}; the report compares every figure: {details.get('report')}")
    return results


class EngineRegression(Exception):
    """A scheduled rerun's decided engine regression (eagle3/bench/watch.py): the flow run fails on it."""
