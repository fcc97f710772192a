"""Prefect task for the preflight doctor: fail a run in seconds, not after a long load."""

from __future__ import annotations

from dataclasses import asdict

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from eagle3.config import load_config
from eagle3.doctor import DoctorFailed, failed, run_doctor
from tasks.artifact_keys import artifact_key


@task(name="preflight", cache_policy=NO_CACHE, retries=0)
def preflight(config_path: str) -> list[dict]:
    cfg = load_config(config_path)
    checks = run_doctor(cfg)
    logger = get_run_logger()
    for c in checks:
        (logger.error if c.status == "FAIL" else logger.warning if c.status == "WARN" else logger.info)(
            "%s %s: %s%s", c.status, c.name, c.reason, f" (fix: {c.fix})" if c.fix and c.status != "PASS" else "")
    rows = [asdict(c) for c in checks]
    create_table_artifact(key=artifact_key(cfg.name, "preflight"), table=rows,
                          description=f"{cfg.name}: preflight doctor")
    if failed(checks):
        raise DoctorFailed(checks)
    return rows
