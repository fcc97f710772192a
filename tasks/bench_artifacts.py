"""Prefect artifacts of the benchmark phase. Thin: everything shown is already in the phase's
summary (eagle3.phases.bench.run_bench) and its report; this only publishes it.

Call `publish_bench_artifacts(cfg.name, summary)` inside a task or flow run (artifacts need a
run context). The flow does, after the bench phase, whether the phase ran or came from the cache.
The report's text itself goes into the artifact: the UI is opened on another machine than the GPU
node, where a `file://` link leads nowhere.
"""

from __future__ import annotations

from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from tasks.artifact_keys import artifact_key

# Table columns, in display order; per-position rates are joined into one cell ("100/95/80").
COLUMNS = ("config", "k", "concurrency", "output_tok_s", "speedup", "speedup_ci", "verdict", "mean_tpot_ms",
           "tpot_speedup", "mean_ttft_ms", "acceptance_rate_pct", "acceptance_length", "per_position_pct", "windows",
           "completed", "failed")


def table_rows(summary: dict) -> list[dict]:
    rows = []
    for row in summary.get("table", []):
        out = {c: row.get(c) for c in COLUMNS}
        out["per_position_pct"] = "/".join(f"{p:.0f}" for p in row.get("per_position_pct") or []) or None
        out["speedup_ci"] = "[{:.2f}, {:.2f}]".format(*row["speedup_ci"]) if row.get("speedup_ci") else None
        rows.append(out)
    return rows


def report_markdown(summary: dict, report_key: str = "report") -> str:
    """The phase's report.md (or trend.md); the node's paths follow as plain text."""
    report = Path(summary[report_key])
    text = report.read_text() if report.is_file() else f"(report {report} is missing)\n"
    return text + f"\nOn the node: report `{report}` · results `{summary['results']}`\n"


def publish_bench_artifacts(name: str, summary: dict) -> dict:
    """Table (one row per server and concurrency) and the markdown report (the bench row's `publish`);
    nothing for a summary without results (a stand-in bench phase in tests)."""
    if not summary.get("results"):
        return {}
    drafter = "trained" if summary["trained"] else "UNTRAINED"
    ids = {
        "table": create_table_artifact(table=table_rows(summary), key=artifact_key(name, "bench", "table"),
                                       description=f"{name}: speculative decoding vs baseline "
                                                   f"(gate: {summary['gate']}, drafter {drafter})"),
        "report": create_markdown_artifact(markdown=report_markdown(summary), key=artifact_key(name, "bench", "report"),
                                           description=f"{name}: benchmark report: speedups with their intervals, "
                                                       "acceptance per position, the gates and the watch"),
    }
    if summary.get("trend"):  # the history's trend: acceptance length and speedup per k over the runs
        ids["trend"] = create_markdown_artifact(markdown=report_markdown(summary, "trend"),
                                                key=artifact_key(name, "bench", "trend"),
                                                description=f"{name}: acceptance length and speedup per k over "
                                                            "every benchmark run of this run dir")
    return {k: str(v) for k, v in ids.items()}
