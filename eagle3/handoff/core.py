"""The GPU handoff between two phases: stop what the pipeline started, purge its stale state,
and prove every GPU free, or refuse to start the next phase.

Order: configured systemd units -> registry sweep (groups of this and of crashed earlier runs,
PID + start time verified) -> every other live process carrying this run's owner token -> owned
GPU holders -> /dev/shm -> __pycache__ -> a polling loop (no fixed sleeps) until every GPU shows
NVML v2 used <= threshold and no holder other than protected ones and observers (monitors with no
GPU context), and no listener is left on the phases' ports, or the deadline passes. Only owned
processes are ever signalled. Anything unverifiable (NVML missing while GPUs are configured, an
NVML error, a foreign holder, memory NVML attributes to no visible context) fails closed with a
HandoffError whose message says what holds which GPU. An owned process that survives SIGKILL is
named with its kernel state, wait channel and the GPUs it pins. The report is written atomically
as JSON into <run_dir>/handoffs/ either way.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from .. import phase_table, progress
from ..process import procfs
from . import pycache, scratch, shm, systemd
from ..phase_table import next_phase
from ..config import Handoff, PipelineConfig
from ..errors import HandoffError, PipelineError
from ..fsio import atomic_write_json
from .gpus import GpuBackend, GpuQueryError, GpuState, NvmlBackend
from .view import summary_line
from ..layout import RunLayout
from .holders import Holder, Ownership, describe_cmd, device_file_holders, find_holders, port_holders
from ..process.services import OWNER_ENV, SERVICE_ENV, Entry, Supervisor, state_dir_for
from ..process.terminate import end_processes

BUSY_UTIL = 90  # % utilisation with no process on the GPU: wedged, not free


@dataclass
class HandoffReport:
    label: str
    run_dir: str
    threshold_mib: int
    started_at: str
    ok: bool = False
    verdict: str = ""
    gpu_check: str = ""
    seconds: float = 0.0
    steps: list[dict] = field(default_factory=list)
    units: list[dict] = field(default_factory=list)
    services: list[dict] = field(default_factory=list)
    ended: list[dict] = field(default_factory=list)
    gpus: list[dict] = field(default_factory=list)
    holders: list[dict] = field(default_factory=list)
    observers: list[dict] = field(default_factory=list)  # fd-only holders with no GPU context: not blocking
    stuck: list[dict] = field(default_factory=list)  # owned processes that survived SIGKILL
    ports: list[dict] = field(default_factory=list)  # listeners found on them (blockers)
    ports_checked: list[int] = field(default_factory=list)  # the ports proven free
    shm: dict = field(default_factory=dict)
    scratch_bytes_removed: dict[str, int] = field(default_factory=dict)  # per purged dir
    pycache: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    path: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class _Steps:
    def __init__(self, report: HandoffReport):
        self.report = report

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[dict]:
        rec = {"name": name, "seconds": 0.0, "detail": ""}
        t0 = time.monotonic()
        try:
            yield rec
        finally:
            rec["seconds"] = round(time.monotonic() - t0, 3)
            self.report.steps.append(rec)


def ports_for(cfg: PipelineConfig, after: str | None, before: str | None) -> list[int]:
    """The ports that must be free: those of the phases on both sides, or of all phases."""
    phases = [p for p in (after, before) if p in phase_table.names()] or list(phase_table.names())
    return sorted({port for p in phases for port in cfg.phase_ports(p)})


def handoff_for_config(cfg: PipelineConfig, after: str = "start", before: str | None = None,
                       backend: GpuBackend | None = None, supervisor: Supervisor | None = None) -> HandoffReport:
    """The handoff after phase `after` ("start" before the first) and before `before` (default: the next)."""
    before = before or next_phase(after)
    label = f"{after}-to-{before or 'end'}"
    return run_handoff(cfg.run_dir, cfg.handoff, list(cfg.gpus), ports_for(cfg, after, before), label=label,
                       backend=backend, supervisor=supervisor)


def recovery_handoff(cfg: PipelineConfig, backend: GpuBackend | None = None, supervisor: Supervisor | None = None,
                     ports: list[int] | None = None) -> HandoffReport:
    """The first step of a run that has just taken the run dir's lease: whatever the registry and
    the owner token still name belongs to a dead earlier run (services, its Prefect server,
    escaped children); end it, purge its /dev/shm files, and prove every GPU and `ports` (default:
    every phase's) free."""
    ports = ports_for(cfg, None, None) if ports is None else ports
    return run_handoff(cfg.run_dir, cfg.handoff, list(cfg.gpus), ports, label="recovery",
                       backend=backend, supervisor=supervisor)


def run_handoff(run_dir: Path, settings: Handoff, gpus: list[int] | None, ports: Iterable[int] = (), *,
                label: str = "", backend: GpuBackend | None = None,
                supervisor: Supervisor | None = None) -> HandoffReport:
    """gpus: the GPU indices to prove free; [] = CPU rehearsal (no GPU check); None = every GPU
    NVML sees. Returns the report when everything is proven free; raises HandoffError otherwise."""
    t0 = time.monotonic()
    run_dir = Path(run_dir)
    report = HandoffReport(label=label, run_dir=str(run_dir), threshold_mib=settings.used_mib_threshold,
                           started_at=datetime.now(timezone.utc).isoformat(timespec="milliseconds"))
    ports = sorted(set(ports))
    report.ports_checked = ports
    step = _Steps(report)
    # Quiet: a handoff shows one line when it ends; while it blocks, the heartbeat says so.
    progress.emit(progress.Event("handoff", progress.START, quiet=True,
                                 message=f"{label or 'handoff'}: stopping what the pipeline started, proving GPUs and "
                                         "ports free"))
    sup = supervisor or Supervisor(state_dir_for(run_dir))
    ownership = Ownership.build(sup.registry.token, sup.registry.entries(), settings.protected_process_names)
    nvml = _Nvml(backend)
    try:
        _stop_units(step, report, settings)
        _stop_services(step, report, sup, ownership, settings)
        checking = nvml.open(step, report, gpus)
        gpus = nvml.gpus if checking else gpus
        open_files = _end_owned_holders(step, report, nvml.backend if checking else None, gpus, ownership, settings)
        _purge(step, report, run_dir, settings)
        with step("verify") as rec:
            # The wait for release counts from here, not from the handoff's start: a service's own stop
            # grace (spent above) may be longer than the whole deadline, and memory is freed only
            # after its last process is gone.
            blockers, reused, released_s = _verify(report, settings, nvml.backend if checking else None, gpus or [],
                                                   ports, ownership, deadline=time.monotonic() + settings.deadline_s,
                                                   open_files=open_files)
            rec["detail"] = "clean" if not blockers else f"{len(blockers)} blocker(s)"
            rec["detail"] += f"; NVML read the GPUs released {released_s:.3f} s into the step" if released_s is not None else ""
            if reused:
                rec["detail"] += "; device files from the holders step's /proc pass (GPUs released at the first look)"
            report.problems[:0] = [_stuck_problem(t, checking) for t in report.stuck]
            report.problems += blockers
            if checking and not blockers:
                seen = f" and {len(report.observers)} observer(s) with no GPU context" if report.observers else ""
                report.gpu_check = (f"verified: GPUs {gpus} at <= {settings.used_mib_threshold} MiB used (NVML v2) "
                                    f"with no process other than protected ones{seen}")
    except BaseException as e:  # the written report must never say "free" for a handoff that broke
        report.problems.append(f"handoff did not finish: {type(e).__name__}: {e}")
        raise
    finally:
        nvml.close()
        report.seconds = round(time.monotonic() - t0, 3)
        report.ok = not report.problems
        report.verdict = "GPUs free: next phase may start" if report.ok else "BLOCKED: next phase must not start"
        report.path = str(_write(run_dir, report))
        progress.emit(progress.Event("handoff", progress.END, ok=report.ok,
                                     message=summary_line(report).removeprefix("handoff ")))
    if not report.ok:
        raise HandoffError(f"GPU handoff{' ' + label if label else ''} refused: " + "; ".join(report.problems), report)
    return report


def _stop_units(step: _Steps, report: HandoffReport, settings: Handoff) -> None:
    with step("systemd units") as rec:
        try:
            report.units = systemd.stop_units(list(settings.systemd_units), settings.deadline_s)
        except HandoffError as e:
            report.units = e.records if isinstance(e, systemd.UnitsNotStopped) else []
            report.problems.append(str(e))
        rec["detail"] = f"{len(report.units)} unit(s)"


def _stop_services(step: _Steps, report: HandoffReport, sup: Supervisor, ownership: Ownership,
                   settings: Handoff) -> None:
    with step("services") as rec:
        outcomes = sup.sweep(settings.grace_s)
        report.services = [asdict(o) | {"clean": o.clean} for o in outcomes]
        for o in outcomes:
            report.stuck += [_stuck(t["pid"], t["describe"], f"service {o.name} (group {o.pgid})") for t in o.stuck]
        report.ended += _members_ended(outcomes)
        marked = _ended(report, _end_marked(ownership, sup.registry.entries(), settings.grace_s, _stuck_pids(report)))
        report.ended += marked
        rec["detail"] = f"{len(outcomes)} registered, {len(marked)} other marked process(es)"


def _members_ended(outcomes) -> list[dict]:
    """The processes of the services stopped, as ended-process records (`service` names their service)."""
    return [{"pid": m["pid"], "cmd": m.get("comm", ""), "reason": f"service {o.name} (group {o.pgid})",
             "service": o.name, "signal": o.signal, "seconds": o.seconds, "state": "",
             "outcome": "survived SIGKILL" if m["pid"] in o.survivors else "exited"}
            for o in outcomes if o.signal in ("SIGTERM", "SIGKILL") for m in o.members]


class _Nvml:
    """The GPU backend of one handoff: the caller's, or NVML opened here (and closed here)."""

    def __init__(self, backend: GpuBackend | None):
        self.backend, self.own, self.gpus = backend, False, None

    def open(self, step: _Steps, report: HandoffReport, gpus: list[int] | None) -> bool:
        """Whether GPUs are checked: not on a CPU rehearsal (gpus == []), nor when NVML fails (a problem)."""
        if gpus is not None and not gpus:
            report.gpu_check = "skipped: no GPUs declared (CPU rehearsal); GPU memory was not checked"
            return False
        with step("NVML") as rec:
            try:
                if self.backend is None:
                    self.backend, self.own = NvmlBackend(), True
                self.gpus = list(range(self.backend.count())) if gpus is None else gpus
                rec["detail"] = f"{self.backend.describe()}; GPUs {self.gpus}"
                return True
            except PipelineError as e:
                report.gpu_check = f"failed: cannot verify GPUs {gpus if gpus is not None else '(all)'}: {e}"
                report.problems.append(report.gpu_check)
                return False

    def close(self) -> None:
        if self.own and self.backend is not None:
            self.backend.close()


def _end_owned_holders(step: _Steps, report: HandoffReport, backend: GpuBackend | None, gpus: list[int] | None,
                       ownership: Ownership, settings: Handoff) -> dict[str, set[int]] | None:
    """End the owned holders; returns this step's /proc pass when it ended none (the verify step may
    reuse it: nothing of ours has changed since), else None."""
    with step("owned GPU holders") as rec:
        if backend is None:  # GPUs not checked
            return None
        try:
            states = _snapshot(backend, gpus)
            open_files = device_file_holders(states, settings.dev_dir, gpus)
            holders = find_holders(states, settings.dev_dir, ownership, gpus, open_files=open_files)
            ended = _ended(report, _end_owned(holders.values(), settings.grace_s, _stuck_pids(report)))
            report.ended += ended
            rec["detail"] = f"{len(holders)} holder(s), {len(ended)} owned ended"
            return None if ended else open_files
        except PipelineError:
            return None  # the verification loop reports NVML errors


def _purge(step: _Steps, report: HandoffReport, run_dir: Path, settings: Handoff) -> None:
    with step("scratch dirs") as rec:  # the rows' `purge` (an online train step's cache): no reader outlives them
        for path in phase_table.scratch_dirs(run_dir):
            report.scratch_bytes_removed[str(path)] = scratch.purge(path)
        rec["detail"] = f"{sum(report.scratch_bytes_removed.values())} bytes removed"
    with step("/dev/shm") as rec:
        result = shm.purge(settings.shm_dir, **shm.names_with_engines())
        report.shm = result.to_dict()
        rec["detail"] = f"{len(result.removed)} removed, {len(result.kept)} kept"
    with step("__pycache__") as rec:
        result = pycache.purge(list(settings.pycache_dirs))
        report.pycache = result.to_dict()
        rec["detail"] = f"{len(result.removed)} file(s) removed"


FIRST_RELEASE_WAIT_S = 0.25  # at least, for the first look (_verify says why)
RELEASE_POLL_S = 0.005  # NVML's memory and process queries take about a millisecond per GPU


def _snapshot(backend: GpuBackend, gpus: list[int]) -> list[GpuState]:
    """Every GPU NVML sees (holders are attributed through all process lists); the GPUs in
    question must be among them."""
    every = backend.snapshot(None)
    missing = sorted(set(gpus) - {s.index for s in every})
    if missing:
        raise GpuQueryError(f"GPU index {missing} not present: NVML sees {len(every)} GPU(s)")
    return every


def _end_marked(ownership: Ownership, entries: list[Entry], default_grace_s: float, skip: set[int]):
    """Live processes carrying this run's owner token that no registry entry covered any more,
    each with the grace recorded for its service (a trainer's rank keeps the trainer's grace)."""
    if not ownership.token:
        return []
    graces = {e.id: e.grace(default_grace_s) for e in entries}
    by_grace: dict[float, list] = {}
    for info in procfs.all_procs():
        if info.zombie or ownership.spares(info) or info.pid in skip:
            continue
        if procfs.environ_value(info.pid, OWNER_ENV) == ownership.token:
            grace = graces.get(procfs.environ_value(info.pid, SERVICE_ENV) or "", default_grace_s)
            by_grace.setdefault(grace, []).append(
                (info.pid, info.start_ticks, describe_cmd(info.pid), "carries this run's owner token"))
    return [e for grace, targets in by_grace.items() for e in end_processes(targets, grace)]


def _end_owned(holders: Iterable[Holder], grace_s: float, skip: set[int]):
    targets = [(h.pid, h.start_ticks, h.cmd, h.why) for h in holders if h.cls == "owned" and h.pid not in skip]
    return end_processes(targets, grace_s) if targets else []


def _stuck(pid: int, state: str, owner: str) -> dict:
    return {"pid": pid, "cmd": describe_cmd(pid), "owner": owner, "state": state, "gpus": [], "used_mib": None}


def _stuck_pids(report: HandoffReport) -> set[int]:
    return {t["pid"] for t in report.stuck}


def _ended(report: HandoffReport, results) -> list[dict]:
    """Ended-process records for the report; survivors of SIGKILL are also recorded as stuck."""
    report.stuck += [_stuck(e.pid, e.state, e.reason) for e in results if e.outcome == "survived SIGKILL"]
    return [e.to_dict() for e in results]


def _stuck_problem(t: dict, checking: bool) -> str:
    if not checking:
        pins = "GPUs not checked"
    elif t["gpus"]:
        mib = f" ({t['used_mib']:.0f} MiB by NVML)" if t["used_mib"] is not None else ""
        pins = f"pins GPU {', '.join(map(str, t['gpus']))}{mib}"
    else:
        pins = "holds none of the GPUs checked"
    return (f"PID {t['pid']} ({t['cmd'] or '?'}) of {t['owner']} survived SIGKILL: {t['state']}; {pins}: "
            "drain the node (GPU reset or reboot)")


def _verify(report: HandoffReport, settings: Handoff, backend: GpuBackend | None, gpus: list[int],
            ports: list[int], ownership: Ownership, deadline: float,
            open_files: dict[str, set[int]] | None = None) -> tuple[list[str], bool, float | None]:
    """Poll until the GPUs and ports are proven free, or the deadline passes. Owned stragglers
    found on the way are ended. A foreign holder, or a process that survived SIGKILL, that stays
    for a whole grace period ends the wait early: nothing this handoff may do will make it go.

    `open_files`: the holders step's /proc pass for device files, taken after every owned process was
    stopped and when it found none left to end. When NVML reads every GPU released at the first look,
    the first check reuses it (its PIDs that exited since dropped) instead of a pass of its own: NVML
    and the ports are read anew, and no process of ours can have opened a GPU since.
    Returns the blockers, whether that pass was reused, and when NVML read the GPUs released (None: later)."""
    done: set[int] = {e["pid"] for e in report.ended}
    first_seen: dict[int, float] = {}
    # The services were stopped a moment ago and the driver frees their memory 0.04-0.1 s after they exit: a
    # full check before that only sees that memory, costs a /proc pass and delays the proof (2026-12-06, H100,
    # a 0.05 s first look: released 0.06-0.08 s into verify, +28 ms over the floor). So the first look lasts
    # FIRST_RELEASE_WAIT_S at least; a holder still there then gets the full check (its ending or naming).
    released, t0 = False, time.monotonic()
    if backend is not None and gpus:
        first = max(settings.poll_interval_s, FIRST_RELEASE_WAIT_S)
        released = _await_release(backend, gpus, settings.used_mib_threshold, min(t0 + first, deadline))
    released_s = round(time.monotonic() - t0, 3) if released else None
    reuse = open_files if released else None
    reused = reuse is not None
    while True:
        now = time.monotonic()
        states: list[GpuState] = []
        holders: dict[int, Holder] = {}
        if backend is not None:
            try:
                every = _snapshot(backend, gpus)
            except PipelineError as e:
                report.gpu_check = f"failed: NVML error: {e}"
                return [report.gpu_check], reused, released_s
            holders = find_holders(every, settings.dev_dir, ownership, gpus, open_files=reuse)
            reuse = None  # later checks make their own pass
            states = [s for s in every if s.index in gpus]
        listeners = port_holders(ports, ownership)
        owned = [(h.pid, h.start_ticks, h.cmd, h.why) for h in holders.values() if h.cls == "owned"]
        owned += [(p["pid"], p["start_ticks"], p["cmd"], p["why"]) for p in listeners if p["class"] == "owned"]
        owned = [t for t in owned if t[0] not in done | _stuck_pids(report)]
        if owned:
            report.ended += _ended(report, end_processes(owned, settings.grace_s))
            done |= {t[0] for t in owned}
            deadline = max(deadline, time.monotonic() + settings.deadline_s)  # their release, as above
            continue
        blockers = _blockers(states, holders, listeners, settings.used_mib_threshold)
        report.gpus = [s.to_dict() for s in states]
        report.holders = [h.to_dict() for h in holders.values() if h.cls != "observer"]
        report.observers = [h.to_dict() for h in holders.values() if h.cls == "observer"]
        report.ports = [{k: v for k, v in p.items() if k != "start_ticks"} for p in listeners]
        for t in report.stuck:
            if t["pid"] in holders:
                t["gpus"], t["used_mib"] = sorted(holders[t["pid"]].gpus), holders[t["pid"]].used_mib
        if not blockers:
            return [], reused, released_s
        # Nothing this handoff may do will make these go: a foreign holder, or one that survived SIGKILL.
        immovable = [h.pid for h in holders.values() if h.cls == "foreign"] + list(_stuck_pids(report))
        immovable += [p["pid"] for p in listeners if p["class"] == "foreign"]
        for pid in immovable:
            first_seen.setdefault(pid, now)
        if any(now - first_seen[pid] >= settings.grace_s for pid in immovable) or now >= deadline:
            return blockers, reused, released_s
        _await_release(backend, gpus, settings.used_mib_threshold, min(now + settings.poll_interval_s, deadline))


def _await_release(backend: GpuBackend | None, gpus: list[int], threshold_mib: float, until: float) -> bool:
    """Wait until `until`, or less: until NVML alone reads every GPU at or under the threshold with no
    process on it. The full proof (NVML and the ports read anew, device-file holders from a /proc pass
    made after every owned process was stopped) then runs at once, not a poll interval after the driver
    freed the memory (it frees a context 0.04-0.1 s after its process is gone); a proof is only ever
    what that full check sees, never this cheap read alone. Returns whether NVML read them released."""
    if backend is None or not gpus:  # nothing to read cheaply: the ports are part of the full check
        time.sleep(max(0.0, until - time.monotonic()))
        return False
    while True:
        try:
            states = backend.snapshot(gpus)
        except PipelineError:
            return False  # the full check reports it
        if all(s.used_mib <= threshold_mib and not s.processes for s in states):
            return True
        if (now := time.monotonic()) >= until:
            return False
        time.sleep(min(RELEASE_POLL_S, until - now))


def _blockers(states: list[GpuState], holders: dict[int, Holder], listeners: list[dict],
              threshold: int) -> list[str]:
    out = []
    for s in states:
        on_gpu = [h for h in holders.values() if s.index in h.gpus]
        listed = [h for h in on_gpu if h.via != {"fd"}]  # on NVML's process lists of this GPU: a context
        named = [f"{h.label()} [{h.cls}: {h.why}; seen via {', '.join(sorted(h.via))}]"
                 for h in on_gpu if h.cls not in ("protected", "observer")]
        if named:
            out.append(f"GPU {s.index} ({s.uuid}) held by " + ", ".join(named))
        if s.used_mib > threshold:
            who = (", ".join(h.label() for h in listed)
                   or "no process on NVML's lists (memory not yet released, a context in another PID namespace, "
                      "or wedged)")
            fd_only = [f"{h.label()} [{h.cls}]" for h in on_gpu if h.via == {"fd"} and h.cls != "protected"]
            if fd_only and not listed:  # nothing explains the memory, so a device-file holder cannot be cleared
                who += "; device file open in: " + ", ".join(fd_only)
            out.append(f"GPU {s.index} ({s.uuid}): {s.used_mib:.0f} MiB used (NVML v2) > {threshold} MiB; holders: {who}")
        if not listed and s.util_gpu is not None and s.util_gpu >= BUSY_UTIL:
            out.append(f"GPU {s.index} ({s.uuid}): {s.util_gpu}% utilisation with no process: wedged? "
                       "(check Xid errors; a reset or drain may be needed)")
    for p in listeners:
        if p["class"] == "protected":
            continue
        who = f"PID {p['pid']} ({p['cmd']}) [{p['class']}: {p['why']}]" if p["pid"] else p["why"]
        out.append(f"port {p['port']} still has a listener: {who}")
    return out


def _write(run_dir: Path, report: HandoffReport) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")
    path = RunLayout(run_dir).handoffs / f"{stamp}-{report.label or 'handoff'}-{os.getpid()}.json"
    report.path = str(path)
    atomic_write_json(path, report.to_dict())
    return path
