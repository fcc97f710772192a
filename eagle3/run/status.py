"""`eagle3 status`: what a run is doing, read from its run dir alone (no Prefect server needed).

Sources, all written atomically by the run: state/run.json and state/progress.json (runstate.py),
the service registry state/services.json (each PID checked alive and still ours by its start
ticks), handoffs/*.json (the last handoff's verdict), state/failures.json (retries so far), the
phases' DONE markers, the extraction's summary, and the run's lease holder. Nothing is written.
"""

from __future__ import annotations

import shutil
import socket
import time
from datetime import datetime
from pathlib import Path

from ..appendlog import read_rows
from ..process import lease, procfs
from .. import phase_table
from ..config import load_config
from ..errors import ConfigError
from . import shard_ledger
from ..fsio import read_json
from ..progress import PhaseView, describe, eta_left, fmt_bytes, fmt_duration
from ..layout import RunLayout
from ..marker import DoneMarker
from ..process.services import Entry


def resolve(target: Path) -> tuple[Path, str | None]:
    """(run dir, config path) from either a config file or a run dir that recorded its config."""
    target = Path(target)
    if target.is_dir():
        record = read_json(RunLayout(target).run_record)
        if record is None:
            raise ConfigError(f"{target}: not a run dir of this pack (no {RunLayout(target).run_record.relative_to(target)}); "
                              "give the pipeline config instead, or the run_dir it names")
        return target.resolve(), record.get("config_path")
    if not target.is_file():
        raise ConfigError(f"{target}: no such config file or run dir")
    cfg = load_config(target, check_files=False)
    return cfg.run_dir, str(target.resolve())


def _process_state(pid: int | None, start_ticks: int | None) -> str:
    info = procfs.read_stat(pid) if pid else None
    if info is None or info.zombie:
        return "gone"
    if start_ticks and info.start_ticks != start_ticks:
        return "gone (PID reused by another process)"
    return "alive"


def _services(run_dir: Path, now: float) -> list[dict]:
    """The run's registered services, then those of its fanned-out shards (each shard is a run dir of its
    own under shards/; a shard on another host is named with its host, its PIDs not checked from here)."""
    out = [_service(e, now) for e in _entries(run_dir)]
    for shard_dir in RunLayout(run_dir).shard_run_dirs():
        host = (lease.lease_holder(shard_dir) or {}).get("host")
        elsewhere = host if host and host != socket.gethostname() else None
        out += [_service(e, now, _shard_label(shard_dir), elsewhere) for e in _entries(shard_dir)]
    return out


def _shard_label(shard_dir: Path) -> str:
    """shards/extract/2-of-2 -> "extract shard 2/2": the words the coordinator's lines use."""
    return f"{shard_dir.parent.name} shard {shard_dir.name.replace('-of-', '/')}"


def _entries(run_dir: Path) -> list[Entry]:
    return [Entry(**raw) for raw in read_json(RunLayout(run_dir).registry, default=[])]


def _service(e: Entry, now: float, shard: str | None = None, host: str | None = None) -> dict:
    if host:
        state = f"on host {host} (not checked from here)"
    else:
        state = {True: "alive", False: "gone (PID reused by another process)", None: "gone"}[e.is_leader_alive_and_ours()]
    return {"name": e.name, "phase": e.phase, "shard": shard, "pid": e.pid, "gpus": e.gpus, "log": e.log,
            "uptime_s": round(now - e.started_at, 1) if e.started_at else None, "state": state}


def _last_handoff(run_dir: Path) -> dict | None:
    reports = sorted(RunLayout(run_dir).handoffs.glob("*.json"))  # names start with a UTC timestamp
    for path in reversed(reports):
        r = read_json(path)
        if r:
            return {"label": r.get("label"), "ok": r.get("ok"), "verdict": r.get("verdict"),
                    "seconds": r.get("seconds"), "at": r.get("started_at"), "problems": r.get("problems", []),
                    "path": str(path)}
    return None


def _server_starts(run_dir: Path, since: float | None) -> list[dict]:
    """The server starts of this run (since it started), then its shards' (each writes its own), oldest
    first: how long each took to be ready, and where that went by the engine's own log (steps)."""
    dirs = [(None, Path(run_dir))] + [(_shard_label(d), d) for d in RunLayout(run_dir).shard_run_dirs()]
    rows = [{"shard": shard, **{k: row.get(k) for k in ("phase", "name", "engine", "seconds", "steps", "at")}}
            for shard, d in dirs for row in read_rows(RunLayout(d).server_starts, "server starts")
            if since is None or float(row.get("at") or 0) >= since]
    return sorted(rows, key=lambda r: float(r.get("at") or 0))


def start_line(start: dict) -> str:
    steps = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in (start.get("steps") or {}).items())
    return (f"{start['shard'] + ': ' if start.get('shard') else ''}{start['name']}: ready in {start['seconds']:.1f} s"
            + (f" ({steps}, by its log)" if steps else ""))


def _hidden_states(run_dir: Path, views: dict[str, PhaseView]) -> dict:
    v = views.get("extract")
    written = expected = None
    if v is not None:
        written, expected = v.detail.get("bytes_written"), v.detail.get("bytes_expected")
    if written is None:
        written = (read_json(RunLayout(run_dir).phase_dir("extract") / "summary.json") or {}).get("total_bytes")
    where = Path(run_dir)
    while not where.exists():
        where = where.parent
    return {"bytes_written": written, "bytes_expected": expected, "disk_free": shutil.disk_usage(where).free,
            "filesystem_of": str(where)}


def _phase_info(phase: str, v: PhaseView | None, marker: DoneMarker | None, status: str, now: float,
                phase_dir: Path) -> dict:
    missing = phase_table.get(phase).missing_outputs(phase_dir) if marker else []
    if missing:  # a DONE marker vouches only for output that is still there
        line = f"not done: its output is gone ({', '.join(missing)} missing in {phase_dir}); a run redoes it"
        return {"done": False, "output": None, "view": v.to_dict() if v else None, "line": line}
    if v is None:
        line = f"done in an earlier run, output {marker.fingerprint}" if marker else "not started"
    elif v.finished_at is None and status != "running":
        # What it had reached when the run stopped: no rate, ETA or activity of a process that is gone.
        stopped = PhaseView.from_dict(v.to_dict() | {"rate": None, "eta_s": None, "activity": "", "waiting": False})
        line = f"stopped ({status}) at: {describe(stopped, now)}"
    else:
        line = describe(v, now)
    return {"done": marker is not None, "output": marker.fingerprint if marker else None,
            "view": v.to_dict() if v else None, "line": line}


def collect(run_dir: Path, config_path: str | None = None, now: float | None = None) -> dict:
    now = time.time() if now is None else now
    run_dir = Path(run_dir)
    layout = RunLayout(run_dir)
    record = read_json(layout.run_record)
    prog = read_json(layout.progress) or {}
    views = {k: PhaseView.from_dict(v) for k, v in (prog.get("phases") or {}).items()}
    status = record.get("status", "unknown") if record else "not started"
    process = _process_state(record.get("pid"), record.get("start_ticks")) if record else None
    if status == "running" and process != "alive":
        status = "died"  # SIGKILL, OOM killer, power loss: it never got to record an outcome
    order = phase_table.names()
    running = [p for p in order if p in views and views[p].finished_at is None]
    phases = {p: _phase_info(p, views.get(p), DoneMarker.from_dict(read_json(layout.done_marker(p))), status, now, layout.phase_dir(p))
              for p in order}
    current = running[-1] if running and status == "running" else None
    reports = [layout.phase_dir(p.name) / p.report for p in phase_table.table() if p.report]
    report = next((r for r in reversed(reports) if r.exists()), None)
    return {
        "run_dir": str(run_dir), "config_path": (record or {}).get("config_path") or config_path,
        "name": (record or {}).get("name"), "status": status, "process": process,
        "pid": (record or {}).get("pid"), "host": (record or {}).get("host"), "command": (record or {}).get("command"),
        "started_at": (record or {}).get("started_at"), "finished_at": (record or {}).get("finished_at"),
        "error": (record or {}).get("error"), "failed_phase": (record or {}).get("phase"),
        "signal": (record or {}).get("signal"),
        "resume": (record or {}).get("resume"), "lease": lease.lease_holder(run_dir),
        "current_phase": current, "current_since": views[current].started_at if current else None,
        "eta_s": eta_left(views[current], now) if current else None, "phases_run": (record or {}).get("phases"),
        "activity": (views.get(prog.get("current")).to_dict() if prog.get("current") in views else None),
        "progress_updated_at": prog.get("updated_at"), "phases": phases, "services": _services(run_dir, now),
        "server_starts": _server_starts(run_dir, (record or {}).get("started_at")),
        "last_handoff": _last_handoff(run_dir), "failures": read_json(layout.failures, default={}),
        "hidden_states": _hidden_states(run_dir, views), "report": str(report) if report else None,
        "shards": {p: shard_lines for p in order if (shard_lines := shard_ledger.lines(run_dir, p))},
        "now": now,
    }


def _timestamp(iso: str | None) -> float | None:
    try:
        return datetime.fromisoformat(iso).timestamp() if iso else None
    except ValueError:
        return None


def _ago(t: float | None, now: float) -> str:
    return "?" if t is None else f"{fmt_duration(now - t)} ago ({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))})"


def render(s: dict) -> str:
    """The status as aligned lines for a person."""
    now = s["now"]
    rows: list[tuple[str, str]] = [("run", f"{s['name'] or '?'}  run dir {s['run_dir']}  config {s['config_path']}")]
    state = s["status"].upper()
    if s["status"] == "running":
        state += f" for {fmt_duration(now - s['started_at'])}, PID {s['pid']} on {s['host']}: {s['command']}"
    elif s["status"] == "died":
        state += (f": PID {s['pid']} that ran it is {s['process']}, without recording an outcome (killed or "
                  "crashed); the services it left are stopped by the next run's handoff")
    elif s["status"] == "interrupted":
        where = f" during {s['failed_phase']}" if s["failed_phase"] else ""
        state += (f" by {s['signal'] or 'a signal'}{where} {_ago(s['finished_at'], now)}: stopped on request (Ctrl-C, "
                  "kill, a scheduler's preemption), not failed; resume it with the command below")
    elif s["finished_at"]:
        state += f" {_ago(s['finished_at'], now)}"
    rows.append(("state", state))
    rows.append(("held by", lease.describe(s["lease"]) if s["lease"] else "nobody (the run dir's lease is free)"))
    if s["current_phase"]:
        order = s["phases_run"] or list(phase_table.names())
        nth = f" ({order.index(s['current_phase']) + 1} of {len(order)})" if s["current_phase"] in order else ""
        rows.append(("phase", f"{s['current_phase']}{nth}, running for {fmt_duration(now - s['current_since'])}"
                              + (f", ETA {fmt_duration(s['eta_s'])}" if s["eta_s"] is not None and s["eta_s"] >= 0
                                 else "")))
    act = s["activity"]
    if act and act["phase"] not in phase_table.names() and act["finished_at"] is None and s["status"] == "running":
        rows.append(("now", f"{act['phase']}: {describe(PhaseView.from_dict(act), now)}"))
    if s["progress_updated_at"] and s["status"] == "running":
        rows.append(("updated", _ago(s["progress_updated_at"], now)))
    for p, info in s["phases"].items():
        rows.append((p, info["line"]))
        rows += [("", line) for line in s.get("shards", {}).get(p, [])]
    for svc in s["services"] or [None]:
        rows.append(("services", "none registered") if svc is None else (
            "service", f"{svc['shard'] + ': ' if svc.get('shard') else ''}{svc['name']} PID {svc['pid']} {svc['state']}, GPUs {svc['gpus'] or '-'}, "
                       f"up {fmt_duration(svc['uptime_s'])}, log {svc['log']}"))
    rows += [("server start", start_line(start)) for start in s.get("server_starts") or []]
    h = s["last_handoff"]
    if h:
        rows.append(("handoff", f"{h['label']}: {h['verdict']} (took {h['seconds']} s), {_ago(_timestamp(h['at']), now)}"
                                + (f"; {'; '.join(h['problems'])}" if h["problems"] else "")))
    for phase, history in (s["failures"] or {}).items():
        last = history[-1] if history else {}
        rows.append(("failures", f"{phase}: {len(history)} so far, last {_ago(last.get('at'), now)}: {last.get('message')}"))
    hs = s["hidden_states"]
    if hs["bytes_written"] is not None:
        of = f" of {fmt_bytes(hs['bytes_expected'])}" if hs["bytes_expected"] else ""
        rows.append(("hidden states", f"{fmt_bytes(hs['bytes_written'])}{of} written; {fmt_bytes(hs['disk_free'])} free"))
    else:
        rows.append(("disk", f"{fmt_bytes(hs['disk_free'])} free on the filesystem of {hs['filesystem_of']}"))
    if s["status"] in ("failed", "died", "interrupted"):
        if s["error"]:
            rows.append(("error", f"{s['failed_phase'] or '?'}: {s['error']}"))
        rows.append(("resume", f"{s['resume']}   (finished phases are skipped)"))
    if s["report"]:
        rows.append(("report", s["report"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
