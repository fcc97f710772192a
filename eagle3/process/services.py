"""Supervised processes: the one way the pack starts, watches and stops anything.

Every process is launched from an argv list (never a shell string) in its own session, so its
process group reaches every descendant, even those re-parented to PID 1. Each launch is recorded
in a registry in the run dir (PID, start time, group, argv, phase, GPUs) that outlives a crash of
the orchestrator, and every process carries an owner token in its environment, so a later run can
prove what it owns. Stopping is SIGTERM to the group, a polled grace period, SIGKILL, then a wait
until nothing of the group is left alive.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from .. import layout, owned
from . import procfs
from ..errors import CommandFailed, ServiceExited, ServiceHung, ServiceStartTimeout
from ..fsio import atomic_write_json, file_lock, read_json, tail
from .terminate import escalate, stuck

log = logging.getLogger("eagle3.services")
OWNER_ENV = "EAGLE3_OWNER_TOKEN"
SERVICE_ENV = "EAGLE3_SERVICE_ID"
LAUNCH_MARKER = "==> eagle3: launching "
state_dir_for = layout.state_dir  # the name the process layer's callers know it by


# ---- registry ----------------------------------------------------------------------------------

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


# ---- stopping ----------------------------------------------------------------------------------

@dataclass
class StopOutcome:
    id: str
    name: str
    pgid: int
    members: list[dict]
    signal: str  # "none" (already gone), "SIGTERM", "SIGKILL", or "skipped"
    seconds: float
    survivors: list[int]
    note: str = ""
    stuck: list[dict] = field(default_factory=list)  # survivors of SIGKILL: pid, comm, kernel state, wchan

    @property
    def clean(self) -> bool:
        return not self.survivors


def proof(entry: Entry, token: str) -> str:
    """What a registry entry read back from disk proves, on its own:
      "ours"     - its leader is alive, has the recorded start ticks, leads its own group, and
                   carries this run's owner token in its environment: its group may be signalled;
      "gone"     - no live leader: only members that carry the token may be signalled, one by one;
      "reused"   - the leader PID now belongs to a process with another start time;
      "unproven" - a live process that does not carry the token (PID and start ticks are
                   world-readable in /proc: anyone who could write the registry could name them).
    Linux never hands out a PID that is still in use as a process-group id, so while the proven
    leader lives, its group is the one we started."""
    alive = entry.is_leader_alive_and_ours()
    if alive is None:
        return "gone"
    if alive is False:
        return "reused"
    if entry.pgid == entry.pid and token and procfs.environ_value(entry.pid, OWNER_ENV) == token:
        return "ours"
    return "unproven"


def _skip_note(entry: Entry, verdict: str) -> str:
    if verdict == "reused":
        return f"PID {entry.pid} now belongs to another process (start time differs); left alone"
    return (f"registry entry names PID {entry.pid} which does not carry this run's token: left alone "
            "(and dropped from the registry)")


def _live(pids: list[int]) -> list[int]:
    return [p for p in pids if procfs.alive(p)]


def _escaped(entry: Entry, token: str) -> list[int]:
    """Processes of this service that left its group (e.g. called setsid) but kept our markers."""
    found = []
    for info in procfs.all_procs():
        if info.zombie or info.pgid == entry.pgid:
            continue
        if procfs.environ_value(info.pid, SERVICE_ENV) == entry.id and procfs.environ_value(info.pid, OWNER_ENV) == token:
            found.append(info.pid)
    return found


def stop_entry(entry: Entry, token: str, grace_s: float, reap: Callable[[], object] | None = None,
               own_child: bool = False) -> StopOutcome:
    """Stop what `entry` names. `own_child`: the caller launched it and holds its Popen (the entry
    is the one in memory, not one read back from the registry file), which proves it ours."""
    t0 = time.monotonic()
    verdict = proof(entry, token)
    if own_child:
        group_ours = verdict != "reused"
    else:
        group_ours = verdict == "ours"
    escaped = _escaped(entry, token)
    if verdict == "gone" and not own_child:
        escaped += [p.pid for p in procfs.group_members(entry.pgid)
                    if p.pid not in escaped and procfs.environ_value(p.pid, OWNER_ENV) == token]
    if not group_ours and not escaped and verdict in ("reused", "unproven"):
        if verdict == "unproven":
            log.warning("registry %s: %s", entry.id, _skip_note(entry, verdict))
        return StopOutcome(entry.id, entry.name, entry.pgid, [], "skipped", 0.0, [], note=_skip_note(entry, verdict))
    members = [{"pid": p.pid, "comm": p.comm} for p in procfs.group_members(entry.pgid)] if group_ours else []
    for pid in escaped:
        info = procfs.read_stat(pid)
        members.append({"pid": pid, "comm": info.comm if info else "?", "escaped": True})
    if not members:
        if reap:
            reap()
        return StopOutcome(entry.id, entry.name, entry.pgid, [], "none", time.monotonic() - t0, [])

    def remaining() -> list[int]:
        if reap:
            reap()
        group = [p.pid for p in procfs.group_members(entry.pgid)] if group_ours else []
        return group + _live(escaped)

    def send(sig: int) -> None:
        if group_ours:
            try:
                os.killpg(entry.pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in _live(escaped):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    result = escalate(send, remaining, grace_s)
    if reap:
        reap()  # the leader may have turned zombie after the last poll; do not leave it unreaped
    left, stuck_ones = result.survivors, stuck(result.survivors)
    note = "" if not left else ("survived SIGKILL (" + "; ".join(f"PID {t['pid']}: {t['describe']}" for t in stuck_ones)
                                + "): drain or reboot the node")
    if not group_ours and verdict != "gone":
        why = "now belongs to another process" if verdict == "reused" else "does not carry this run's token"
        note = (f"PID {entry.pid} {why} (group left alone); "
                f"ended processes carrying this service's markers. {note}").strip()
    return StopOutcome(entry.id, entry.name, entry.pgid, members, result.signal, round(time.monotonic() - t0, 3), left,
                       note=note, stuck=stuck_ones)


# ---- readiness and watchdog --------------------------------------------------------------------

class Probe(Protocol):
    def ready(self) -> bool: ...
    def describe(self) -> str: ...


class HttpProbe:
    """Ready on the expected status; a refused or timed-out connection means "still starting"."""

    def __init__(self, url: str, status: int = 200, headers: dict[str, str] | None = None):
        self.url, self.status, self.headers = url, status, headers or {}

    def ready(self) -> bool:
        import httpx

        try:
            return httpx.get(self.url, timeout=2.0, headers=self.headers).status_code == self.status
        except httpx.HTTPError:
            return False

    def describe(self) -> str:
        return f"GET {self.url} -> {self.status}"


class LogProbe:
    """Ready once the current launch's part of the log has a line matching `pattern`.

    Logs are appended to across relaunches (retries keep the earlier attempts' output), so text
    before the last launch marker is never matched: an old "ready" line must not pass a new launch."""

    FIRST_READ = 1 << 20

    def __init__(self, log: Path, pattern: str):
        self.log, self.regex = Path(log), re.compile(pattern, re.MULTILINE)
        self._offset: int | None = None
        self._carry = ""
        self._seen = False

    def ready(self) -> bool:
        if self._seen:  # sticky: the line may scroll out of what is re-read while other probes wait
            return True
        try:
            with open(self.log, "rb") as fh:
                if self._offset is None:
                    fh.seek(0, os.SEEK_END)
                    self._offset = max(0, fh.tell() - self.FIRST_READ)
                fh.seek(self._offset)
                chunk = fh.read().decode(errors="replace")
                self._offset = fh.tell()
        except FileNotFoundError:
            return False
        text = self._carry + chunk
        cut = text.rfind(LAUNCH_MARKER)
        if cut >= 0:
            text = text[cut + len(LAUNCH_MARKER):]
        self._carry = text[-4096:]  # keeps a line split across two reads matchable
        self._seen = bool(self.regex.search(text))
        return self._seen

    def describe(self) -> str:
        return f"log line /{self.regex.pattern}/"


class Watchdog:
    """Declares a process hung when nothing it does has progressed for `silence_s`.

    Progress is any of: its log grows; one more readiness probe passes (a starting server); one of
    `paths` changes (a one-shot command's outputs, e.g. a trainer's checkpoints); where it has GPUs,
    their NVML used memory moves by MEM_STEP_MIB (a loading model allocates). Utilisation is no
    signal either way: in a deadlocked NCCL group one rank spins at 100 % in the collective the
    others never join, the others idle at 0 %, and all hold their memory still (measured on
    2 x H200). Where GPUs are configured but cannot be read, silence alone never ends the process
    (its startup budget or timeout still does). A phase that legitimately stays silent with
    constant memory (a long compile) needs hang_timeout_s above its length."""

    SAMPLE_S = 1.0  # GPUs and output paths are read at most this often (and once more before a verdict)
    MEM_STEP_MIB = 1.0

    def __init__(self, log: Path, silence_s: float | None, gpu_sample: Callable[[], list | None] | None = None,
                 paths: list[Path] | tuple = ()):
        self.log, self.silence_s, self.gpu_sample, self.paths = Path(log), silence_s, gpu_sample, list(paths)
        now = time.monotonic()
        self._log_size, self._log_since, self._since = -1, now, now
        self._ready, self._stamp, self._sampled_at = 0, _tree_stamp(self.paths), -float("inf")
        self._mem: tuple[float, ...] | None = None  # GPU memory at its last move
        self._mem_since = now
        self._gpus: list | None = None  # the last GPU reading (states with used_mib, util_gpu), None: unreadable

    def _sample(self, now: float) -> None:
        self._sampled_at = now
        stamp = _tree_stamp(self.paths)
        if stamp != self._stamp:
            self._stamp = stamp
            self._since = now
        if self.gpu_sample is None:
            return
        self._gpus = self.gpu_sample()
        if self._gpus is None:
            return
        mem = tuple(g.used_mib for g in self._gpus)
        if self._mem is None or len(mem) != len(self._mem) or any(
                abs(a - b) >= self.MEM_STEP_MIB for a, b in zip(mem, self._mem)):
            if self._mem is not None:
                self._since = now
            self._mem, self._mem_since = mem, now

    def hung(self, ready: int = 0) -> bool:
        """`ready`: how many readiness probes pass now (more than before is progress)."""
        if self.silence_s is None:
            return False
        now = time.monotonic()
        try:
            size = self.log.stat().st_size
        except FileNotFoundError:
            size = 0
        if size != self._log_size:
            self._log_size, self._log_since = size, now
            self._since = now
        if ready > self._ready:
            self._ready = ready
            self._since = now
        if now - self._sampled_at >= self.SAMPLE_S:
            self._sample(now)
        if now - self._since < self.silence_s:
            return False
        self._sample(now)  # a fresh reading before the verdict
        if now - self._since < self.silence_s:
            return False
        return self.gpu_sample is None or self._gpus is not None

    def describe(self) -> str:
        """What the verdict rests on, for the error message."""
        now = time.monotonic()
        parts = [f"no log output for {now - self._log_since:.0f} s"]
        if self._ready:
            parts.append(f"{self._ready} readiness probe(s) passing, no more since")
        if self.paths:
            parts.append(f"no change under {', '.join(map(str, self.paths))}")
        if self._gpus:
            used = "/".join(f"{g.used_mib:.0f}" for g in self._gpus)
            util = "/".join("?" if g.util_gpu is None else str(g.util_gpu) for g in self._gpus)
            parts.append(f"GPU memory unchanged for {now - self._mem_since:.0f} s on GPUs "
                         f"{[g.index for g in self._gpus]} ({used} MiB used; utilisation {util} %, "
                         "not a progress signal)")
        return ", ".join(parts)


def _tree_stamp(paths: list[Path], limit: int = 10_000) -> tuple[int, int, int]:
    """(files, bytes, newest mtime in ns) under `paths`: changes when anything there is written.
    Stops after `limit` files, so a huge output tree costs a bounded scan."""
    files = size = newest = 0
    todo = [str(p) for p in paths]
    while todo and files < limit:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return files, size, newest


# ---- launching ---------------------------------------------------------------------------------

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
                                     live.popen.poll, own_child=True)
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
            self.outcome = stop_entry(self.entry, self.sup.registry.token, grace, self.popen.poll, own_child=True)
            if self.outcome.clean:
                self.sup.registry.remove(self.entry.id)
                self.sup._forget(self.entry.id)
        return self.outcome

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
