"""One shard, run on the node that picked it up: the phase itself over the shard's slice, in the
shard's own run dir, under that run dir's lease and this node's GPU leases, with a GPU handoff
before and after it and a heartbeat while it runs. Resumable like the phase: a shard that ran
before (here or on another node) keeps what it finished."""

from __future__ import annotations

from typing import Callable

from .. import phase_table, progress
from ..config import PipelineConfig
from ..marker import DoneMarker
from ..phase_runner import run_phase
from ..process.lease import hold
from ..run.record import recording
from .node import Heartbeat, identity, port_offset, shard_config, stage_inputs
from ..slices import Shard

# (the shard's config, after, before) -> report; raises HandoffError when the GPUs cannot be proven free
Handoff = Callable[[PipelineConfig, str, "str | None"], object]


def handoff_in_process(shard_cfg: PipelineConfig, after: str, before: str | None) -> object:
    from ..handoff.core import handoff_for_config

    return handoff_for_config(shard_cfg, after=after, before=before)


def run_shard(cfg: PipelineConfig, shard: Shard, upstream: str | None, handoff: Handoff = handoff_in_process,
              on_progress: progress.ProgressFn | None = None, lease_wait_s: float = 0.0,
              heartbeat_every_s: float | None = None, where: dict | None = None, force: bool = False,
              force_token: str | None = None, config_path: str = "") -> tuple[DoneMarker, dict]:
    """Run `shard` of its phase to completion on this node; returns the shard's DONE marker and
    the node it ran on. `upstream`: the fingerprint of the run's upstream output (the
    coordinator's), recorded in the shard's marker like a phase's."""
    phase_table.get(shard.phase).merge()  # a phase that cannot be sharded fails here, named
    scfg = shard_config(cfg, shard, port_offset())
    node = {**identity(), **(where or {})}
    with hold(scfg.run_dir, list(cfg.gpus), lease_wait_s):
        beat = Heartbeat(scfg.layout.heartbeat, shard, **({"every_s": heartbeat_every_s} if heartbeat_every_s else {}),
                         **(where or {}))
        with beat, recording(scfg, config_path, [shard.phase]):
            stage_inputs(cfg, scfg, shard.phase)
            handoff(scfg, "start", shard.phase)
            marker = run_phase(scfg, shard.phase, on_progress=on_progress, upstream=upstream, force=force,
                               force_token=force_token, options={"shard": (shard.index, shard.count)})
            handoff(scfg, shard.phase, phase_table.next_phase(shard.phase))
    return marker, node
