"""Prefect tasks for the four phases. Thin: caching, retries, progress and artifacts only;
the work is in eagle3.phase_runner.run_phase."""

from __future__ import annotations

import contextlib

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.runtime import task_run

from eagle3.config import load_config
from eagle3.run import failures
from eagle3 import progress
from tasks.artifact_keys import artifact_key
from eagle3.phase_runner import done_key, run_phase
from tasks.fanout import fanned_out


def phase_cache_key(context, parameters) -> str:
    """The DONE marker's key (eagle3.phase_runner.done_key), from the same pinned config and the same
    upstream fingerprint the task hands run_phase: a cached result stands for exactly the output a
    valid marker stands for, and the flow refreshes the cache whenever no valid marker
    exists (deleted output, a redone upstream), so the cache never says "done" when the marker does not."""
    cfg = load_config(parameters["config_path"], check_files=False)
    phase = parameters["phase"]
    return "-".join(["eagle3", cfg.name, phase, done_key(cfg, phase, parameters.get("upstream"))])


def retry_if_transient(task, task_run, state) -> bool:
    """Retry crashes, hangs and lost connections; never bad config or a failed gate, and never
    the same failure twice in a row (a deterministic bug would cost another full model load)."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - the state's exception is what we classify
        return bool(getattr(exc, "retryable", False)) and not getattr(exc, "repeated", False)
    return False


@contextlib.contextmanager
def progress_artifact(cfg_name: str, phase: str, description: str | None = None):
    """A progress artifact for the phase, fed by its done/total events (at most ~100 API calls a
    phase) while the block runs; at 100 % when it ends normally."""
    artifact_id = create_progress_artifact(progress=0.0, description=f"{cfg_name}: {description or phase}")
    last = [-1.0]

    def on_progress(event: progress.Event) -> None:
        if event.phase != phase or event.kind != progress.PROGRESS or not event.total:
            return
        pct = round(100.0 * (event.done or 0) / event.total, 1)
        if pct - last[0] >= 1.0 or event.done == event.total:
            update_progress_artifact(artifact_id=artifact_id, progress=pct)
            last[0] = pct

    with progress.subscribed(on_progress):
        yield
    update_progress_artifact(artifact_id=artifact_id, progress=100.0)


@task(name="phase", persist_result=True, cache_key_fn=phase_cache_key, retries=2, retry_delay_seconds=[5, 30],
      retry_condition_fn=retry_if_transient, task_run_name="{phase}")
def phase_task(config_path: str, phase: str, upstream: str | None = None, force: bool = False,
               force_token: str | None = None) -> dict:
    logger = get_run_logger()
    cfg = load_config(config_path)
    if task_run.run_count > 1:
        logger.info("retry %s of phase %s: resuming from what the previous attempt left", task_run.run_count, phase)
    try:
        with progress_artifact(cfg.name, phase):
            marker = run_phase(cfg, phase, force=force, force_token=force_token, upstream=upstream,
                               body=fanned_out(cfg, config_path, phase, upstream, force, force_token))
    except Exception as exc:
        if getattr(exc, "retryable", False) and failures.record(cfg.run_dir, phase, exc):
            exc.repeated = True
            logger.error("phase %s failed twice the same way (%s): not retrying",
                         phase, failures.signature(exc).split(" ", 1)[1])
        raise
    failures.clear(cfg.run_dir, phase)
    summary = marker.summary  # eagle3.phases.PhaseSummary.to_dict()
    details = summary["details"]
    lines = "\n".join(f"| {k} | {v} |" for k, v in details.items() if not isinstance(v, (dict, list)))
    create_markdown_artifact(key=artifact_key(cfg.name, phase),
                             markdown=f"### {phase} done\n\n{summary['headline']}\n\n"
                                      f"| item | value |\n|---|---|\n{lines}\n",
                             description=f"{cfg.name}: {phase} summary")
    logger.info("phase %s done (output %s)", phase, marker.fingerprint)
    return {"phase": phase, "fingerprint": marker.fingerprint, "summary": summary}
