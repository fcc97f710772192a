"""The benchmark's Prefect artifacts against the session's real Prefect server: the results table,
the markdown report with the plot linked by absolute path, and a link artifact to the PNG."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _artifacts(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def test_publish_bench_artifacts(prefect_server, tmp_path):
    from prefect import flow

    from eagle3.report import write_report
    from tasks.bench_artifacts import artifact_key, publish_bench_artifacts
    from tests.phases.test_bench import _results

    results = _results()
    report, plot = tmp_path / "report.md", tmp_path / "bench.png"
    write_report(results, report, plot)
    summary = {"report": str(report), "plot": str(plot), "results": str(tmp_path / "results.json"),
               "table": results["table"], "gate": results["gate"]["status"], "trained": False}

    @flow
    def publish():
        return publish_bench_artifacts("Tiny CPU", summary)

    ids = publish()
    assert set(ids) == {"table", "report", "plot"}
    (table,) = _artifacts(artifact_key("Tiny CPU", "table"))
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert len(rows) == 6 and rows[4]["config"] == "k=3" and rows[4]["speedup"] == 1.8
    assert rows[4]["per_position_pct"] == "60/40/20"  # one cell per row, readable in the UI
    (md,) = _artifacts(artifact_key("Tiny CPU", "report"))
    assert "| k=3 | 1 | 180.0 | 1.80× |" in md.data and f"](file://{plot})" in md.data
    (link,) = _artifacts(artifact_key("Tiny CPU", "plot"))
    assert f"file://{plot}" in link.data
