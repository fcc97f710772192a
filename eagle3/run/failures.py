"""Failure signatures: the same failure twice in a row is not transient; stop paying for loads.

A signature is the error class, the exit code and the last error-looking line of the service log,
with numbers, addresses and paths normalised so two runs of one bug compare equal."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

from ..fsio import atomic_write_json, file_lock, read_json
from ..layout import RunLayout

_ERROR_LINE = re.compile(r"(Error|Exception|error:|FAILED|Traceback|Killed|Aborted|CUDA|NCCL|OOM)", re.I)
_NOISE = [(re.compile(r"0x[0-9a-fA-F]+"), "0x?"), (re.compile(r"(/[\w.\-]+)+"), "<path>"),
          (re.compile(r"\d+(\.\d+)?"), "N")]


def last_error_line(log_tail: str) -> str:
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line[:300]
    return lines[-1][:300] if lines else ""


def signature(exc: BaseException) -> str:
    line = last_error_line(getattr(exc, "log_tail", "") or str(exc))
    for pattern, repl in _NOISE:
        line = pattern.sub(repl, line)
    code = getattr(exc, "returncode", None)
    raw = f"{type(exc).__name__}|{code}|{line}"
    return hashlib.sha256(raw.encode()).hexdigest()[:12] + " " + raw


def record(run_dir: Path, phase: str, exc: BaseException) -> bool:
    """Record a failure; True when it repeats the previous failure of this phase (stop retrying)."""
    layout = RunLayout(run_dir)
    path = layout.failures
    sig = signature(exc)
    with file_lock(layout.failures_lock):
        data = read_json(path, default={})
        history = data.setdefault(phase, [])
        repeated = bool(history) and history[-1]["signature"] == sig
        history.append({"signature": sig, "at": time.time(), "message": str(exc).splitlines()[0][:300]})
        data[phase] = history[-20:]
        atomic_write_json(path, data)
    return repeated


def clear(run_dir: Path, phase: str) -> None:
    layout = RunLayout(run_dir)
    path = layout.failures
    with file_lock(layout.failures_lock):
        data = read_json(path, default={})
        if data.pop(phase, None) is not None:
            atomic_write_json(path, data)
