"""Prefect artifacts of the benchmark phase. Thin: everything shown is already in the phase's
summary (eagle3.phases.bench.run_bench) and its report; this only publishes it.

Call `publish_bench_artifacts(cfg.name, summary)` inside a task or flow run (artifacts need a
run context), e.g. in the phase task after the bench phase finished."""

from __future__ import annotations

import re
from pathlib import Path

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

# Table columns, in display order; per-position rates are joined into one cell ("100/95/80").
COLUMNS = ("config", "k", "concurrency", "output_tok_s", "speedup", "mean_tpot_ms", "tpot_speedup", "mean_ttft_ms",
           "acceptance_rate_pct", "acceptance_length", "per_position_pct", "completed", "failed")


def artifact_key(name: str, what: str) -> str:
    # Prefect keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", f"{name}-bench-{what}".lower()).strip("-")


def table_rows(summary: dict) -> list[dict]:
    rows = []
    for row in summary.get("table", []):
        out = {c: row.get(c) for c in COLUMNS}
        out["per_position_pct"] = "/".join(f"{p:.0f}" for p in row.get("per_position_pct") or []) or None
        rows.append(out)
    return rows


def report_markdown(summary: dict) -> str:
    """The phase's report.md, with the plot as an absolute file link (the UI cannot embed a local PNG)."""
    report, plot = Path(summary["report"]), Path(summary["plot"])
    text = report.read_text() if report.is_file() else f"(report {report} is missing)\n"
    return text.replace(f"]({plot.name})", f"](file://{plot})") + f"\nPlot: `{plot}` · results: `{summary['results']}`\n"


def publish_bench_artifacts(name: str, summary: dict) -> dict:
    """Table (one row per server and concurrency), the markdown report, and a link to the PNG."""
    ids = {
        "table": create_table_artifact(table=table_rows(summary), key=artifact_key(name, "table"),
                                       description=f"{name}: speculative decoding vs baseline (gate: {summary['gate']}, "
                                                   f"drafter {'trained' if summary['trained'] else 'UNTRAINED'})"),
        "report": create_markdown_artifact(markdown=report_markdown(summary), key=artifact_key(name, "report"),
                                           description=f"{name}: benchmark report"),
        "plot": create_link_artifact(link=f"file://{summary['plot']}", link_text=Path(summary["plot"]).name,
                                     key=artifact_key(name, "plot"),
                                     description=f"{name}: throughput and TPOT vs concurrency, per-position acceptance"),
    }
    return {k: str(v) for k, v in ids.items()}
