"""The supervised-process registry: one entry per launched process group (PID, start time, group,
argv, phase, GPUs), in the run dir's state/services.json, which outlives a crash of the orchestrator,
and the run's owner token that every launched process carries in its environment, so a later run
can prove what it owns."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import layout, owned
from . import procfs
from ..fsio import atomic_write_json, file_lock, read_json

log = logging.getLogger("eagle3.services")
OWNER_ENV = "EAGLE3_OWNER_TOKEN"
SERVICE_ENV = "EAGLE3_SERVICE_ID"
state_dir_for = layout.state_dir  # the name the process layer's callers know it by


@dataclass
class Entry:
    id: str
    name: str
    phase: str
    pid: int
    pgid: int
    start_time: float
    argv: list[str]
    log: str
    gpus: list[int] = field(default_factory=list)
    started_at: float = 0.0
    unit: str | None = None
    start_ticks: int = 0  # exact identity (clock ticks since boot); 0 in registries written before it existed
    stop_grace_s: float = 0.0  # the service's own grace; every stop path uses it (0: written before it existed)
    scope: str = "phase"  # "phase": ended by every handoff; "run": lives as long as its orchestrator
    orchestrator_pid: int = 0  # the process that launched it (holds the run lease), with its start ticks
    orchestrator_ticks: int = 0

    def is_leader_alive_and_ours(self) -> bool | None:
        """True: the leader PID is our process; False: it now belongs to another one; None: no live leader."""
        info = procfs.read_stat(self.pid)
        if info is None or info.zombie:
            return None
        if self.start_ticks:
            return info.start_ticks == self.start_ticks
        return procfs.same_process(self.pid, self.start_time)

    def grace(self, default_s: float) -> float:
        return self.stop_grace_s or default_s

    def orchestrator_alive(self) -> bool:
        return bool(self.orchestrator_pid) and procfs.same_start(self.orchestrator_pid, self.orchestrator_ticks)

    def serves_a_live_run(self) -> bool:
        """A run-scoped service (e.g. the run's own Prefect server) whose run is still going:
        handoffs between phases must leave it alone; once its orchestrator is gone, it is a leftover."""
        return self.scope == "run" and self.orchestrator_alive()


class Registry:
    """JSON file of owned processes, updated under a lock with atomic replaces."""

    def __init__(self, state_dir: Path):
        self.state_dir = owned.private_dir(state_dir, "state directory")
        self.path = self.state_dir / layout.REGISTRY
        self.lock_path = self.state_dir / layout.REGISTRY_LOCK
        self.token = self._token()

    def _token(self) -> str:
        """The run's secret: processes carrying it in their environment are the run's, and the keys
        of its servers derive from it, so only the user may read it (0600)."""
        path = self.state_dir / layout.OWNER_TOKEN
        with file_lock(self.lock_path):
            with owned.opened(path, os.O_RDWR | os.O_CREAT, 0o600, what="owner token") as fd:
                token = os.read(fd, 4096).decode(errors="replace").strip()
                if not token:
                    token = secrets.token_hex(16)
                    os.write(fd, token.encode())
                    os.fsync(fd)
                if os.fstat(fd).st_mode & 0o077:  # written readable by an earlier version
                    os.fchmod(fd, 0o600)
            return token

    def secret(self, purpose: str) -> str:
        """A secret of this run for `purpose` (a server's API key, the Prefect server's auth), derived
        from the owner token: the same on every resume, known only to who can read the token."""
        return hmac.new(self.token.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    def entries(self) -> list[Entry]:
        return [Entry(**e) for e in read_json(self.path, default=[])]

    def add(self, entry: Entry) -> None:
        with file_lock(self.lock_path):
            items = [e for e in read_json(self.path, default=[]) if e["id"] != entry.id]
            atomic_write_json(self.path, items + [asdict(entry)])

    def remove(self, entry_id: str) -> bool:
        """Drop an entry whose processes are gone. False when the registry could not be rewritten
        (e.g. the run dir's disk is full): the stale entry is harmless, as a later sweep finds its
        group gone (or its PID reused) and drops it then; the caller's own error must not be masked."""
        try:
            with file_lock(self.lock_path):
                items = read_json(self.path, default=[])
                atomic_write_json(self.path, [e for e in items if e["id"] != entry_id])
        except OSError as e:
            log.warning("registry %s: could not drop %s (%s); a later sweep drops it", self.path, entry_id, e)
            return False
        return True
