"""Benchmark rerun: the benchmark phase alone, with its handoffs, against the latest trained
drafter; made for a cron schedule (see deployments/)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.pipeline import run_phases, teardown


@flow(name="eagle3-benchmark", on_crashed=[teardown], on_cancellation=[teardown])
def eagle3_benchmark(config_path: str, doctor: bool = True, lease_wait_s: float = 0.0) -> dict:
    """Re-measure: serve baseline and target+drafter again and record a fresh result; the
    preflight doctor runs first unless `doctor` is False. A rerun that finds another run on the
    run dir or its GPUs waits up to `lease_wait_s` seconds, then fails naming that run."""
    return run_phases(str(Path(config_path).resolve()), ["bench"], force=["bench"], doctor=doctor,
                      lease_wait_s=lease_wait_s)
