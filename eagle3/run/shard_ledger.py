"""The coordinator's record of a fanned-out phase (state/shards.json of the run), and what it
reads of each shard's own run dir: its heartbeat and its progress. `eagle3 status` shows it.

One entry per shard: its index, the pool it was last sent to, the attempt, its Prefect flow run,
its state, the node it ran on (from its heartbeat), its done/total, and the cause of a failure."""

from __future__ import annotations

import time
from pathlib import Path

from .. import phase_table
from ..fsio import atomic_write_json, read_json
from ..layout import RunLayout
from ..slices import Shard


def shard_dir(run_dir: Path, shard: Shard) -> Path:
    return RunLayout(run_dir).shard_run_dir(shard.phase, shard.index, shard.count)


def legacy_dirs_problem(run_dir: Path, phase: str) -> str | None:
    """Shard dirs numbered from 0 (`0-of-2`, `1-of-2`: the pack before 2026-12-06) cannot be resumed under
    the numbering from 1: `1-of-2` would be another shard's. Nothing is renamed (their records name
    their own paths); the operator removes them, and those shards are redone."""
    where = RunLayout(run_dir).root / "shards" / phase
    if not any(where.glob("0-of-*")):
        return None
    return (f"{where}: its shard dirs are numbered from 0 (a run dir of an earlier pack version); shards are "
            f"numbered from 1 now, and {where}/1-of-N would be read as another shard's. Remove {where} (those "
            f"shards are redone; the phase's merged output, if done, is kept), then run again")


def heartbeat(run_dir: Path, shard: Shard) -> dict | None:
    """The shard's last heartbeat (host, boot id, PID, `at`), or None if it never beat."""
    try:
        beat = read_json(RunLayout(shard_dir(run_dir, shard)).heartbeat)
    except (OSError, ValueError):
        return None
    return beat if isinstance(beat, dict) and isinstance(beat.get("at"), (int, float)) else None


def progress_of(run_dir: Path, shard: Shard, since: float = 0.0) -> tuple[int | None, int | None]:
    """(done, total) of the shard's phase as run since `since` (an attempt's start: what an earlier run
    of the shard left is not this attempt's progress): the total from the shard's own progress record,
    the done count from the files its output holds where the phase row counts them (a progress record
    can lag or read 0 for a shard that wrote everything), else from the record."""
    layout = RunLayout(shard_dir(run_dir, shard))
    try:
        prog = read_json(layout.progress) or {}
    except (OSError, ValueError):
        prog = {}
    view = (prog.get("phases") or {}).get(shard.phase) or {}
    if float(view.get("started_at") or 0.0) < since:
        return None, None
    done, total = view.get("done"), view.get("total")
    written = phase_table.get(shard.phase).count_written(layout.phase_dir(shard.phase))
    if written is not None and (written or done is not None or total is not None):
        done = max(written, done or 0)
    return done, total


def write(run_dir: Path, phase: str, entries: list[dict], run: str) -> None:
    """The shards of `phase` as coordinator run `run` sees them now; an earlier run's record moves into
    the phase's history, oldest first (its moves and attempts stay readable after a forced rerun)."""
    path = RunLayout(run_dir).shards_record
    try:
        record = read_json(path) or {}
    except (OSError, ValueError):
        record = {}
    now = time.time()
    last = record.get(phase) if isinstance(record.get(phase), dict) else {}
    history = list(last.get("history") or [])
    if last.get("shards") and last.get("run") != run:
        history.append({k: v for k, v in last.items() if k != "history"})
    started = last.get("started_at") if last.get("run") == run else now
    record[phase] = {"run": run, "count": len(entries), "started_at": started, "updated_at": now,
                     "shards": entries, "history": history}
    atomic_write_json(path, record)


def read(run_dir: Path) -> dict:
    try:
        record = read_json(RunLayout(run_dir).shards_record) or {}
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def lines(run_dir: Path, phase: str) -> list[str]:
    """One line per shard of `phase`, for `eagle3 status`."""
    entry = read(run_dir).get(phase) or {}
    out = []
    for s in entry.get("shards") or []:
        done, total = s.get("done"), s.get("total")
        count = f", {done}/{total}" if total else ""
        waiting = str(s.get("state", "")).startswith("waiting")  # its words name the pool
        node = f" on {s['pool']}" + (f" (host {s['host']})" if s.get("host") else "") \
            if s.get("pool") and not waiting else ""
        before = s.get("earlier") or []
        tries = (f", attempt {s['attempt']} (before: " + "; ".join(
            f"{e.get('state')} on {e.get('pool')}: {e.get('cause')}" for e in before) + ")") if before else ""
        cause = f": {s['cause']}" if s.get("cause") else ""
        out.append(f"shard {s.get('index', 0) + 1}/{entry.get('count')}: {s.get('state', '?')}{node}{count}{tries}{cause}")
    if entry.get("history"):
        out.append(f"earlier runs of this phase: {len(entry['history'])} (state/shards.json keeps their moves and attempts)")
    return out
