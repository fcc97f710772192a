"""Prefect task for the GPU handoff between phases. Thin: never cached (the state it checks is the
machine's, not the inputs'), logs the report table and publishes it as artifacts; the work is in
eagle3.handoff."""

from __future__ import annotations

import re

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from eagle3.config import load_config
from eagle3.errors import HandoffError
from eagle3.handoff import handoff_for_config, next_phase
from eagle3.handoff_view import gpu_rows, to_markdown, to_text


def artifact_key(name: str, label: str) -> str:
    # Prefect artifact keys allow lowercase letters, digits and dashes only.
    return re.sub(r"[^a-z0-9-]+", "-", f"{name}-handoff-{label}".lower()).strip("-")


def publish(cfg_name: str, report: dict, logger) -> None:
    key = artifact_key(cfg_name, report["label"])
    (logger.info if report["ok"] else logger.error)("GPU handoff %s\n%s", report["label"], to_text(report))
    create_markdown_artifact(key=key, markdown=to_markdown(report), description=f"GPU handoff {report['label']}")
    rows = gpu_rows(report) or [{"gpu": "-", "note": report["gpu_check"]}]
    create_table_artifact(key=f"{key}-gpus", table=rows, description=f"GPU handoff {report['label']}: GPUs")


@task(name="gpu-handoff", cache_policy=NO_CACHE, retries=0, task_run_name="handoff-after-{after}")
def gpu_handoff(config_path: str, after: str = "start", before: str | None = None) -> dict:
    """Prove the GPUs free after phase `after` ("start": before the first); raises HandoffError
    (the flow then stops) when they cannot be proven free."""
    logger = get_run_logger()
    cfg = load_config(config_path, check_files=False)
    try:
        report = handoff_for_config(cfg, after=after, before=before or next_phase(after)).to_dict()
    except HandoffError as e:
        if e.report is not None and hasattr(e.report, "to_dict"):
            publish(cfg.name, e.report.to_dict(), logger)
        raise
    publish(cfg.name, report, logger)
    return {"label": report["label"], "ok": report["ok"], "seconds": report["seconds"], "path": report["path"]}
