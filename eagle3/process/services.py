"""Supervised processes: the one way the pack starts, watches and stops anything.

Every process is launched from an argv list (never a shell string) in its own session, so its
process group reaches every descendant, even those re-parented to PID 1. Each launch is recorded
in a registry in the run dir (PID, start time, group, argv, phase, GPUs) that outlives a crash of
the orchestrator, and every process carries an owner token in its environment, so a later run can
prove what it owns. Stopping is SIGTERM to the group, a polled grace period, SIGKILL, then a wait
until nothing of the group is left alive.

The registry (registry.py), stopping (stopping.py) and readiness (readiness.py) are its parts; the
names callers use are re-exported here.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import owned
from . import procfs
from ..errors import CommandFailed, ServiceExited, ServiceHung, ServiceStartTimeout
from ..fsio import tail
from .readiness import LAUNCH_MARKER, HttpProbe, LogProbe, Probe, Watchdog
from .registry import OWNER_ENV, SERVICE_ENV, Entry, Registry, state_dir_for
from .stopping import StopOutcome, proof, stop_entry

__all__ = ["OWNER_ENV", "SERVICE_ENV", "LAUNCH_MARKER", "Entry", "HttpProbe", "LaunchSpec", "LogProbe", "Probe",
           "Process", "Registry", "StopOutcome", "Supervisor", "Watchdog", "proof", "state_dir_for", "stop_entry"]

log = logging.getLogger("eagle3.services")


@dataclass
class LaunchSpec:
    name: str
    argv: list[str]
    log: Path
    phase: str = ""
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    gpus: list[int] = field(default_factory=list)
    stop_grace_s: float = 20.0
    hang_timeout_s: float | None = None
    progress_paths: list[Path] = field(default_factory=list)  # changes here count as progress for the watchdog
    secrets: list[str] = field(default_factory=list)  # argv values masked in the registry and log
    scope: str = "phase"  # "run": not a phase's service but the run's own (see Entry.scope)
    stop_leader_first: bool = False  # SIGTERM to the leader alone first (stopping.stop_entry says why)

    def __post_init__(self):
        # A string would be iterated as characters; argv must be a real list (no shell strings).
        if not isinstance(self.argv, (list, tuple)) or not self.argv or not all(isinstance(a, str) for a in self.argv):
            raise TypeError(f"{self.name}: argv must be a non-empty list of strings, got {self.argv!r}")

    def shown_argv(self) -> list[str]:
        return ["***" if a in self.secrets else a for a in self.argv]


class Supervisor:
    """Launches and stops the pipeline's processes; one per run dir state folder."""

    def __init__(self, state_dir: Path, gpu_sample: Callable[[list[int]], list | None] | None = None):
        """gpu_sample(indices): NVML states of those GPUs (used_mib, util_gpu), None when unreadable."""
        self.registry = Registry(state_dir)
        self.gpu_sample = gpu_sample
        self._live: dict[str, "Process"] = {}

    def launch(self, spec: LaunchSpec) -> "Process":
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        sid = f"{spec.name}-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, **spec.env, OWNER_ENV: self.registry.token, SERVICE_ENV: sid}
        if spec.gpus:
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, spec.gpus))
        log_fd = owned.open_own(spec.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what="service log")
        with os.fdopen(log_fd, "ab") as log:
            log.write(f"\n{LAUNCH_MARKER}{spec.name}: {spec.shown_argv()!r}\n".encode())
            log.flush()
            # umask: what the process writes (outputs, caches, logs in the run dir) is the user's alone.
            popen = subprocess.Popen(spec.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     env=env, cwd=spec.cwd, start_new_session=True, close_fds=True,
                                     umask=owned.PRIVATE_UMASK)
        # Read while the child is unreaped: even if it already exited, its zombie keeps the PID and stat.
        started = procfs.start_time(popen.pid) or 0.0
        ticks = procfs.start_ticks(popen.pid) or 0
        me = os.getpid()
        entry = Entry(id=sid, name=spec.name, phase=spec.phase, pid=popen.pid, pgid=popen.pid, start_time=started,
                      argv=spec.shown_argv(), log=str(spec.log), gpus=list(spec.gpus), started_at=time.time(),
                      start_ticks=ticks, stop_grace_s=spec.stop_grace_s, scope=spec.scope,
                      orchestrator_pid=me, orchestrator_ticks=procfs.start_ticks(me) or 0)
        try:
            self.registry.add(entry)
        except BaseException:
            # Unrecorded, it would outlive this run unseen (e.g. the run dir's disk is full): end it now.
            stop_entry(entry, self.registry.token, spec.stop_grace_s, popen.poll, own_child=True)
            raise
        proc = Process(self, spec, popen, entry)
        self._live[sid] = proc
        return proc

    def run(self, spec: LaunchSpec, timeout_s: float | None = None, retryable_codes: set[int] | None = None) -> int:
        """Run a one-shot command to completion under the same supervision as a service."""
        with self.launch(spec) as proc:
            return proc.wait(timeout_s, retryable_codes=retryable_codes)

    def stop_all(self) -> list[StopOutcome]:
        return [proc.stop() for proc in list(self._live.values())]

    def sweep(self, default_grace_s: float, include_live_run_services: bool = False,
              phase: str | None = None) -> list[StopOutcome]:
        """Stop every registry entry (of `phase` alone, when given), including those of crashed
        earlier runs, each with its own recorded grace (`default_grace_s` only for entries written
        before graces were recorded). The services of a still-running run (its Prefect server) stay
        unless asked for."""
        outcomes = []
        for entry in self.registry.entries():
            if (entry.serves_a_live_run() and not include_live_run_services) or (phase and entry.phase != phase):
                continue
            live = self._live.pop(entry.id, None)
            if live is not None:  # our own child: the entry in memory, not the file's
                outcome = stop_entry(live.entry, self.registry.token, live.entry.grace(default_grace_s),
                                     live.popen.poll, own_child=True, leader_first=live.spec.stop_leader_first)
            else:
                outcome = stop_entry(entry, self.registry.token, entry.grace(default_grace_s))
            if outcome.clean:
                self.registry.remove(entry.id)
            outcomes.append(outcome)
        return outcomes

    def _forget(self, sid: str) -> None:
        self._live.pop(sid, None)


class Process:
    def __init__(self, sup: Supervisor, spec: LaunchSpec, popen: subprocess.Popen, entry: Entry):
        self.sup, self.spec, self.popen, self.entry = sup, spec, popen, entry
        self.outcome: StopOutcome | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, max_bytes: int = 4000) -> str:
        return tail(self.spec.log, max_bytes)

    def _watchdog(self) -> Watchdog:
        sample = None
        if self.spec.gpus and self.sup.gpu_sample is not None:
            sample = lambda: self.sup.gpu_sample(self.spec.gpus)  # noqa: E731
        return Watchdog(self.spec.log, self.spec.hang_timeout_s, sample, self.spec.progress_paths)

    def wait_ready(self, probes: list[Probe], timeout_s: float, poll_s: float = 0.5,
                   on_wait: Callable[[float], None] | None = None) -> float:
        """Block until every probe passes. Fails fast with the log tail if the process exits,
        and tears the process down before raising on timeout or hang. Returns seconds waited.
        `on_wait(seconds waited so far)` is called once per poll while not ready (a heartbeat)."""
        t0 = time.monotonic()
        dog = self._watchdog()
        while True:
            rc = self.popen.poll()
            if rc is not None:
                self.stop()
                raise ServiceExited(f"{self.spec.name} exited with code {rc} before it was ready", self.log_tail())
            passing = sum(p.ready() for p in probes)
            if passing == len(probes):
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout_s:
                self.stop()
                raise ServiceStartTimeout(f"{self.spec.name} not ready after {timeout_s:.0f} s "
                                          f"(waiting for {', '.join(p.describe() for p in probes)})", self.log_tail())
            if dog.hung(passing):
                why = dog.describe()  # before the stop's grace period adds to every duration in it
                self.stop()
                raise ServiceHung(f"{self.spec.name} hung during startup: {why}", self.log_tail())
            if on_wait is not None:
                on_wait(time.monotonic() - t0)
            time.sleep(poll_s)

    def check_alive(self) -> None:
        rc = self.popen.poll()
        if rc is not None:
            self.stop()
            raise ServiceExited(f"{self.spec.name} exited with code {rc} while in use", self.log_tail())

    def wait(self, timeout_s: float | None = None, retryable_codes: set[int] | None = None, poll_s: float = 0.2) -> int:
        """Wait for a one-shot command; non-zero exit raises CommandFailed with the log tail."""
        t0 = time.monotonic()
        dog = self._watchdog()
        while (rc := self.popen.poll()) is None:
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                self.stop()
                raise ServiceStartTimeout(f"{self.spec.name} did not finish within {timeout_s:.0f} s", self.log_tail())
            if dog.hung():
                why = dog.describe()
                self.stop()
                raise ServiceHung(f"{self.spec.name} hung: {why}", self.log_tail())
            time.sleep(poll_s)
        self.stop()  # the leader is done; end anything it left behind in its group
        if rc != 0:
            raise CommandFailed(f"{self.spec.name} failed with exit code {rc}", self.log_tail(), returncode=rc,
                                retryable=rc in (retryable_codes or set()) or rc < 0)
        return rc

    def stop(self, grace_s: float | None = None) -> StopOutcome:
        if self.outcome is None or not self.outcome.clean:
            grace = self.spec.stop_grace_s if grace_s is None else grace_s
            self.outcome = stop_entry(self.entry, self.sup.registry.token, grace, self.popen.poll, own_child=True,
                                      leader_first=self.spec.stop_leader_first)
            if self.outcome.clean:
                self.sup.registry.remove(self.entry.id)
                self.sup._forget(self.entry.id)
        return self.outcome

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
