"""What a run records for `eagle3 status`, under its run dir's state folder, always atomically:

  run.json       which config and phases, who runs it (PID + start ticks, host, command), when it
                 started, and once it ends: completed / failed (which phase, the error) /
                 interrupted, and the command that resumes it
  progress.json  one view per phase (done/total, rate, ETA, details, what it waits on), rewritten
                 at most once a second while events arrive, and at every phase start and end

A run that dies without unwinding (SIGKILL, power loss) leaves run.json saying "running" with a
PID that is gone or belongs to another process now; `eagle3 status` checks that.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

from ..process import procfs
from .. import progress
from .. import phase_table
from ..config import PipelineConfig
from ..fsio import atomic_write_json
from ..progress import END, PROGRESS, START, WAIT, Event, Tracker
from ..layout import RunLayout

WRITE_EVERY_S = 1.0
log = logging.getLogger("eagle3.run.record")


def run_file(run_dir: Path) -> Path:
    return RunLayout(run_dir).run_record


def progress_file(run_dir: Path) -> Path:
    return RunLayout(run_dir).progress


class StatusFile:
    """Progress sink: the run's views as JSON, throttled; frequent kinds (progress, wait) write at
    most every `every_s`, the rest (start, step, end) at once."""

    def __init__(self, path: Path, every_s: float = WRITE_EVERY_S):
        self.path, self.every_s = Path(path), every_s
        self.tracker = Tracker()
        self._lock = threading.Lock()
        self._written = 0.0

    def __call__(self, e: Event) -> None:
        with self._lock:
            self.tracker.apply(e)
            if e.kind not in (PROGRESS, WAIT) or time.monotonic() - self._written >= self.every_s:
                self._write()

    def flush(self) -> None:
        with self._lock:
            self._write()

    def _write(self) -> None:
        self._written = time.monotonic()
        atomic_write_json(self.path, {"updated_at": time.time(), "pid": os.getpid(), "current": self.tracker.current,
                                      "phases": {k: v.to_dict() for k, v in self.tracker.views.items()}})


def resume_command(config_path: str, phases: list[str]) -> str:
    """The command that picks the run up again: finished phases are skipped, so the same
    selection of phases without --force (a forced phase that finished must not be redone)."""
    cmd = ["eagle3", "run", config_path]
    if list(phases) != list(phase_table.names()):
        cmd += ["--only", phases[0]] if len(phases) == 1 else ["--from", phases[0]]
    return shlex.join(cmd)


@contextlib.contextmanager
def recording(cfg: PipelineConfig, config_path: str, phases: list[str], pinned: str | None = None) -> Iterator[StatusFile]:
    """Record the run (run.json) and its progress (progress.json) for the duration of the block;
    `pinned`: the copy of the config the run reads (eagle3.config.pinned)."""
    me = os.getpid()
    record = {"name": cfg.name, "config_path": str(config_path), "pinned_config": pinned,
              "run_dir": str(cfg.run_dir), "phases": list(phases),
              "pid": me, "start_ticks": procfs.start_ticks(me), "host": socket.gethostname(),
              "command": shlex.join(sys.argv), "started_at": time.time(), "status": "running",
              "resume": resume_command(str(config_path), phases)}
    atomic_write_json(run_file(cfg.run_dir), record)
    sink = StatusFile(progress_file(cfg.run_dir))
    outcome: dict = {"status": "completed"}
    with progress.subscribed(sink):
        progress.emit(Event("run", START, message=f"pipeline {cfg.name}: {', '.join(phases)}"))
        try:
            yield sink
        except BaseException as e:
            if (sig := progress.interrupting_signal(e)) is not None:
                outcome = {"status": "interrupted", "signal": sig, "phase": _failed_phase(sink.tracker)}
                raise
            outcome = {"status": "failed", "error": progress.error_line(e), "error_type": type(e).__name__,
                       "phase": _failed_phase(sink.tracker)}
            raise
        finally:
            message = (progress.INTERRUPTED + outcome["signal"]) if outcome["status"] == "interrupted" else outcome["status"]
            progress.emit(Event("run", END, ok=outcome["status"] == "completed", message=message))
            record.update(outcome, finished_at=time.time())
            try:  # the record must never mask the run's own error
                sink.flush()
                atomic_write_json(run_file(cfg.run_dir), record)
            except OSError as e:
                log.warning("could not record the run's outcome in %s: %s", run_file(cfg.run_dir), e)


STEPS = ("preflight", "handoff")  # the run's steps that are not phases, named when one of them failed


def _failed_phase(tracker: Tracker) -> str | None:
    """The pipeline phase (or the preflight doctor, or a handoff) that was running, or ended failed,
    when the run ended."""
    known = set(phase_table.names()) | set(STEPS)
    for name in reversed(list(tracker.views)):
        v = tracker.views[name]
        if name in known and (v.finished_at is None or v.ok is False):
            return name
    return tracker.current if tracker.current in known else None

