"""The benchmark's Prefect artifacts against the session's real Prefect server: the results table
and the markdown report's own text (the UI runs on another machine than the node's files)."""

from __future__ import annotations

import json
import uuid

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _artifacts(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_publish_bench_artifacts(prefect_server, tmp_path):
    from prefect import flow

    from eagle3.bench.report import write_report
    from tasks.artifact_keys import artifact_key
    from tasks.bench_artifacts import publish_bench_artifacts
    from tests.flows.benchdata import synthetic_results as _results

    name = f"Tiny CPU {uuid.uuid4().hex[:8]}"  # the session's server also holds other tests' pipelines' artifacts
    results = _results()
    report = tmp_path / "report.md"
    write_report(results, report)
    summary = {"report": str(report), "results": str(tmp_path / "results.json"),
               "table": results["table"], "gate": results["gate"]["status"], "trained": False}

    @flow
    def publish():
        return publish_bench_artifacts(name, summary)

    ids = publish()
    assert set(ids) == {"table", "report"}
    (table,) = _artifacts(artifact_key(name, "bench", "table"))
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert len(rows) == 6 and rows[4]["config"] == "k=3" and rows[4]["speedup"] == 1.8
    assert rows[4]["per_position_pct"] == "60/40/20"  # one cell per row, readable in the UI
    assert rows[4]["verdict"] == "undecided" and rows[4]["windows"] == 1  # one window decides nothing
    (md,) = _artifacts(artifact_key(name, "bench", "report"))
    assert md.data.startswith(report.read_text()) and "| k=3 | 1 | 180.0 | 1.80× |" in md.data
    assert "file://" not in md.data and "![" not in md.data

    report.unlink()  # a report gone from the node still publishes its table, saying so
    publish()
    latest = max(_artifacts(artifact_key(name, "bench", "report")), key=lambda a: a.created)
    assert latest.data.startswith(f"(report {report} is missing)")


def test_publish_the_trend_of_the_recorded_history(prefect_server, tmp_path):
    """The trend over tests/fixtures/bench-history, as the bench phase writes it, published as a
    markdown artifact."""
    from pathlib import Path

    from prefect import flow

    from eagle3.bench.trend import write_trend
    from tasks.artifact_keys import artifact_key
    from tasks.bench_artifacts import publish_bench_artifacts
    from tests.flows.benchdata import synthetic_results as _results

    name = f"Trend CPU {uuid.uuid4().hex[:8]}"
    history = Path(__file__).resolve().parents[1] / "fixtures" / "bench-history"
    trend = tmp_path / "trend.md"
    rows = write_trend(history, trend)
    results = _results()
    summary = {"report": str(tmp_path / "report.md"), "trend": str(trend), "results": str(tmp_path / "results.json"),
               "table": results["table"],
               "gate": "passed", "trained": True}

    @flow
    def publish():
        return publish_bench_artifacts(name, summary)

    assert set(publish()) == {"table", "report", "trend"} and len(rows) == 4
    (md,) = _artifacts(artifact_key(name, "bench", "trend"))
    assert "| 2 | 2026-11-30T20:00:45 | 0.32.0 | `3992c62d55f9` | 3 | 1.392 | 23.9 |" in md.data
    assert md.data.startswith(trend.read_text()) and "![" not in md.data
