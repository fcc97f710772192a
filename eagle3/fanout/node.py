"""What the node a shard runs on contributes: who it is (for the operator and for proving a
heartbeat fresh), the port offset of its servers, and the shard's own config and inputs.

A node is where a worker runs. Two workers on one host act as two nodes when their environments
differ the way two machines would: EAGLE3_LOCK_DIR (the node-wide GPU leases) and
EAGLE3_PORT_OFFSET (added to every server port of the shards it runs; 0 on a real node)."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from .. import phase_table
from ..errors import ConfigError
from ..fsio import atomic_write_json, link_or_copy
from ..phase_runner import upstream_of
from ..ticker import Ticker
from ..slices import Shard

PORT_OFFSET_ENV = "EAGLE3_PORT_OFFSET"
HEARTBEAT_EVERY_S = 5.0
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
log = logging.getLogger("eagle3.fanout")


def identity() -> dict:
    """This node and process: the host name, the kernel's boot id (a host name alone does not say a
    machine rebooted), the PID."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = ""
    return {"host": socket.gethostname(), "boot_id": boot, "pid": os.getpid()}


def port_offset(env: dict | None = None) -> int:
    raw = (os.environ if env is None else env).get(PORT_OFFSET_ENV, "0").strip() or "0"
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 30000:
        raise ConfigError(f"${PORT_OFFSET_ENV}={raw!r} on this node: give a whole number of ports from 0 to 30000 "
                          "(the shift of this node's server ports; unset it on a node of its own)")
    return value


def shard_config(cfg, shard: Shard, offset: int = 0):
    """The config a shard runs with: its own run dir under the run's `shards/`, and every server's
    port moved by the node's offset (checked to stay a port)."""
    update: dict = {"run_dir": cfg.layout.shard_run_dir(shard.phase, shard.index, shard.count)}
    if offset:
        for phase, server, _ in phase_table.servers(cfg):
            port = server.port + offset
            if port > 65535:
                raise ConfigError(f"{phase}.server.port {server.port} + ${PORT_OFFSET_ENV} {offset} = {port} is not a "
                                  f"port; lower the offset of this node")
            section = cfg.section(phase)
            update[phase] = section.model_copy(update={"server": server.model_copy(update={"port": port})})
    return cfg.model_copy(update=update)


def stage_inputs(cfg, shard_cfg, phase: str) -> list[Path]:
    """Make the upstream outputs the phase reads visible in the shard's run dir, as hard links to the
    run's own (no copy: the shard reads the very file the upstream wrote); replaced on every call, so
    a redone upstream is what the shard sees. Falls back to a copy where links are refused."""
    up = upstream_of(cfg, phase)  # the one upstream rule
    if up is None:
        return []
    staged = []
    for rel in phase_table.get(up).outputs:
        src, dst = cfg.phase_dir(up) / rel, shard_cfg.phase_dir(up) / rel
        if rel.endswith("/") or not src.is_file():
            raise ConfigError(f"shard of {phase!r}: its input {src} is missing or not a file; finish {up!r} first")
        dst.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(src, dst)
        staged.append(dst)
    return staged


class Heartbeat(Ticker):
    """Rewrites the shard's heartbeat file every few seconds while the shard runs on this node: what
    the coordinator reads to tell a slow shard from one whose node or worker died."""

    def __init__(self, path: Path, shard: Shard, every_s: float = HEARTBEAT_EVERY_S, **extra):
        super().__init__(every_s, "eagle3-heartbeat")
        self.path, self.shard, self.extra = Path(path), shard, extra

    def tick(self) -> None:
        try:
            self._write()
        except OSError as e:  # a full or flaky disk: the coordinator will see the heartbeat age, and say so
            log.warning("heartbeat %s: %s", self.path, e)

    def _write(self) -> None:
        atomic_write_json(self.path, {**identity(), **self.extra, "phase": self.shard.phase, "index": self.shard.index,
                                      "count": self.shard.count, "at": time.time()})

    def __enter__(self):
        self.tick()  # fresh before the first interval: a just-started shard is never "silent"
        return super().__enter__()

    def last_tick(self) -> None:
        pass  # the last write stays: its age says when the shard stopped beating
