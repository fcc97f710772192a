"""Prefect task for the GPU handoff between phases. Thin: never cached (the state it checks is the
machine's, not the inputs'), logs one line (the full report when it fails) and publishes one
compact markdown artifact; the work is in eagle3.handoff."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from eagle3.config import PipelineConfig, load_config
from eagle3.errors import HandoffError
from eagle3.handoff.core import handoff_for_config
from eagle3.phase_table import next_phase
from eagle3.handoff.view import summary_line, to_markdown, to_text
from tasks.artifact_keys import artifact_key


def publish(cfg_name: str, report: dict, logger) -> None:
    if report["ok"]:
        logger.info(summary_line(report))
    else:
        logger.error("%s\n%s", summary_line(report), to_text(report))
    create_markdown_artifact(key=artifact_key(cfg_name, "handoff", report["label"]), markdown=to_markdown(report),
                             description=f"GPU handoff {report['label']}: {report['verdict']}")


@task(name="gpu-handoff", cache_policy=NO_CACHE, retries=0, task_run_name="handoff-after-{after}")
def gpu_handoff(config_path: str | PipelineConfig, after: str = "start", before: str | None = None) -> dict:
    """Prove the GPUs free after phase `after` ("start": before the first); raises HandoffError
    (the flow then stops) when they cannot be proven free. `config_path` may be a loaded config
    (a shard's, whose run dir is its own)."""
    logger = get_run_logger()
    cfg = config_path if isinstance(config_path, PipelineConfig) else load_config(config_path, check_files=False)
    try:
        report = handoff_for_config(cfg, after=after, before=before or next_phase(after)).to_dict()
    except HandoffError as e:
        if e.report is not None:
            publish(cfg.name, e.report.to_dict(), logger)
        raise
    publish(cfg.name, report, logger)
    return {"label": report["label"], "ok": report["ok"], "seconds": report["seconds"], "path": report["path"]}
