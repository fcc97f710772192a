"""The optional `fanout` section: phases run as shards on several nodes, a node being a Prefect
work pool with a worker on it (docs/fanout.md). Without the section a run is single-node, exactly
as before; the section never changes what a phase produces, so it is in no fingerprint."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from ..errors import echo
from .types import PositiveFloat, Strict

PoolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")]


class Fanout(Strict):
    pools: list[PoolName] = Field(min_length=1, description=(
        "The nodes: Prefect work pools, each with a worker on its node (`prefect work-pool create NAME --type "
        "process`, then `prefect worker start --pool NAME` there). Shard i starts on pool i mod len(pools), counting "
        "only pools with an online worker when some have none."))
    shards: dict[str, Annotated[int, Field(strict=True, ge=1, le=4096)]] = Field(default_factory=dict, description=(
        "Shards per phase, e.g. {datagen: 4, extract: 4}; only phases that can be sharded (datagen, extract). "
        "A phase not named here, or with 1, runs on this node as without the section."))
    retries: int = Field(2, ge=0, le=100, description=(
        "Further attempts of a shard that failed or whose node went silent, each on the next pool with an online "
        "worker; finished rows of the shard are kept."))
    heartbeat_timeout_s: PositiveFloat = Field(180.0, description=(
        "A running shard whose heartbeat (a file it rewrites every few seconds under the run dir) is older than "
        "this is declared lost (its node or worker died) and retried."))
    start_timeout_s: PositiveFloat = Field(60.0, description=(
        "A shard still waiting for a worker after this long, on a pool with no worker or whose worker is lost (a "
        "node gone before its shard started), moves to the next pool with a live worker; not a failed attempt."))
    worker_lost_after_s: PositiveFloat | None = Field(None, description=(
        "A worker whose last heartbeat to Prefect is older than this counts as lost. Default: two of the worker's "
        "own heartbeat intervals (PREFECT_WORKER_HEARTBEAT_SECONDS: 30 s unless set, so 60 s); Prefect itself "
        "calls a worker offline only after three, on its own schedule (~93 s seen). A shard waits at most "
        "max(start_timeout_s, this) + poll_interval_s on a pool whose worker died before it started."))
    poll_interval_s: PositiveFloat = Field(2.0, description="How often the coordinator looks at its shards.")

    @field_validator("pools")
    @classmethod
    def _distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"pool names must be distinct, got {echo(v)}")
        return v

    def count(self, phase: str) -> int:
        return self.shards.get(phase, 1)


def fanned_phases(cfg, phases) -> list[str]:
    """The phases of `phases` this config runs as more than one shard."""
    f = getattr(cfg, "fanout", None)
    return [p for p in phases if f is not None and f.count(p) > 1]


def fanout_checks(cfg) -> list[tuple[str, str]]:
    """Rules spanning the section and the rest: only shardable phases, offline hidden states."""
    from .. import phase_table

    f = getattr(cfg, "fanout", None)
    if f is None:
        return []
    problems = []
    shardable = [p.name for p in phase_table.table() if p.shards]
    for phase, n in f.shards.items():
        if phase not in shardable:
            problems.append((f"fanout.shards.{phase}", f"{phase!r} cannot be sharded; shardable phases: "
                             f"{', '.join(shardable) or 'none'}"))
    if f.count("extract") > 1 and cfg.hidden_states.mode == "online":
        problems.append(("fanout.shards.extract", "sharded extraction writes hidden-state files; it needs "
                         "hidden_states.mode offline or auto (online extraction happens during training, on one node)"))
    return problems
