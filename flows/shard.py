"""One shard of a fanned-out phase, run by the worker of the node pool it was sent to (a
deployment `eagle3-shard/<pool>` per pool, which the pipeline flow creates; docs/fanout.md). The
work is eagle3.fanout.shard.run_shard: the phase over the shard's slice in the shard's own run
dir, with this node's leases, a handoff before and after it, and a heartbeat."""

from __future__ import annotations

import socket

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Failed

from eagle3.config import load_config
from eagle3.fanout.shard import run_shard
from eagle3.slices import Shard
from eagle3.progress.display import unattended_lines
from tasks.handoff import gpu_handoff
from tasks.logs import quiet_console_restatements, route_pack_logs
from tasks.phases import progress_artifact
from tasks.fanout import NOT_RETRYABLE
from tasks.secrets import provide_api_keys


@flow(name="eagle3-shard", validate_parameters=True)  # the coordinator names each run: "<config>: <shard> (attempt n)"
def eagle3_shard(config_path: str, phase: str, index: int, count: int, upstream: str | None = None,
                 force: bool = False, force_token: str | None = None):
    """Run one shard of a fanned-out phase on this node.

    Args:
        config_path: The pipeline's config (absolute, on storage every node mounts).
        phase: The fanned-out phase (datagen or extract).
        index: This shard, from 0.
        count: How many shards the phase has.
        upstream: The fingerprint of the upstream output the shard consumes (the coordinator's).
        force: Redo the shard (once per force_token).
        force_token: The coordinator's run id: a retried shard does not wipe what this run redid.
    """
    route_pack_logs()
    quiet_console_restatements()
    logger = get_run_logger()
    cfg = load_config(config_path)
    provide_api_keys(cfg)
    shard = Shard(phase, index, count)
    where = {"flow_run": str(flow_run.id or "")}

    def handoff(scfg, after, before):  # a task of this flow run: its report is an artifact, as in the pipeline
        return gpu_handoff(scfg, after=after, before=before)

    try:
        with progress_artifact(cfg.name, phase, shard.label), unattended_lines(logger.info):
            marker, node = run_shard(cfg, shard, upstream, handoff=handoff, where=where, force=force,
                               force_token=force_token, config_path=config_path)
    except Exception as e:  # noqa: BLE001 - the coordinator needs to know whether another node could do better
        if getattr(e, "retryable", False):
            raise
        logger.error("%s failed: %s: %s", shard.label, type(e).__name__, e)
        return Failed(message=f"{NOT_RETRYABLE}on host {socket.gethostname()}: {type(e).__name__}: {e}")
    logger.info("%s done on %s (output %s)", shard.label, node["host"], marker.fingerprint)
    return {"fingerprint": marker.fingerprint, "node": node, "summary": marker.summary}
