"""What a run is doing, as events fanned out to whoever watches: the terminal (registered by the
CLI), the Prefect progress artifact (registered by the task), the run's status file (registered
for the whole run, read by `eagle3 status`). Framework-free: phases and services emit plain
events; a sink that fails is dropped from that event, never the phase.

An event says which phase, what kind (start/progress/step/wait/end/note), done/total in a unit,
a message (what is happening or waited on) and a small dict of details (tok/s, bytes, loss...).
A Tracker folds events into one view per phase (rate, ETA, the activity waited on), and
`describe` turns a view into the one line that the terminal, the log and `eagle3 status` show.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

log = logging.getLogger("eagle3.progress")

START, PROGRESS, STEP, WAIT, END, NOTE = "start", "progress", "step", "wait", "end", "note"
INTERRUPTED = "interrupted by "  # an END message starting so: stopped by a signal, not failed
RATE_WINDOW_S = 120.0  # the rate (and so the ETA) follows the last two minutes, not the whole phase


@dataclass(frozen=True)
class Event:
    phase: str                      # a pipeline phase, or "run", "preflight", "handoff"
    kind: str = PROGRESS
    done: int | None = None
    total: int | None = None
    unit: str = ""
    message: str = ""               # what is happening, or what is waited on
    detail: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)
    ok: bool = True                 # for END: finished normally or not
    quiet: bool = False             # update the views but print no line for it (a display's choice)


Sink = Callable[[Event], None]
ProgressFn = Callable[[int, int], None]  # on_progress(done, total): one phase's progress, for a caller
_sinks: list[Sink] = []
_lock = threading.RLock()


def emit(event: Event) -> None:
    with _lock:
        sinks = list(_sinks)
    for sink in sinks:
        try:
            sink(event)
        except Exception:  # noqa: BLE001 - showing progress must never fail the work it shows
            log.debug("progress sink %r failed on %r", sink, event, exc_info=True)


@contextlib.contextmanager
def subscribed(sink: Sink) -> Iterator[Sink]:
    with _lock:
        _sinks.append(sink)
    try:
        yield sink
    finally:
        with _lock:
            if sink in _sinks:
                _sinks.remove(sink)


def counts(phase: str, on_progress: ProgressFn) -> Sink:
    """A sink that hands `phase`'s progress events to on_progress(done, total)."""
    def sink(event: Event) -> None:
        if event.phase == phase and event.kind == PROGRESS and event.done is not None and event.total is not None:
            on_progress(event.done, event.total)
    return sink


def watched_by(kind: type) -> bool:
    """Whether a sink of this type is subscribed (e.g. a terminal display: then the flow need not log lines)."""
    with _lock:
        return any(isinstance(s, kind) for s in _sinks)


def step(phase: str, message: str, **detail) -> None:
    emit(Event(phase, STEP, message=message, detail=detail))


def waiting(phase: str, message: str, waited_s: float, **detail) -> None:
    emit(Event(phase, WAIT, message=message, detail={"waited_s": round(waited_s, 1), **detail}))


def note(phase: str, message: str, ok: bool = True, **detail) -> None:
    emit(Event(phase, NOTE, message=message, detail=detail, ok=ok))


def interrupting_signal(e: BaseException) -> str | None:
    """"SIGINT"/"SIGTERM" when `e` is how a run unwinds on that signal, else None: Ctrl-C and, under
    `eagle3 run`, SIGTERM raise KeyboardInterrupt; inside a flow run Prefect raises its own
    TerminationSignal (a BaseException carrying `.signal`). Preemption (Slurm, kubelet) is SIGTERM:
    an interrupted run, to be resumed, not a failed one."""
    if isinstance(e, KeyboardInterrupt):  # the CLI's handler says which signal: KeyboardInterrupt("signal 15")
        said = str(e.args[0]) if e.args else ""
        number = int(said.split()[-1]) if said.startswith("signal ") and said.split()[-1].isdigit() else signal.SIGINT
        return signal.Signals(number).name
    number = getattr(e, "signal", None)
    if not isinstance(e, Exception) and number in (signal.SIGTERM, signal.SIGINT):
        return signal.Signals(number).name
    return None


def error_line(exc: BaseException) -> str:
    """`Type: first line of the message`, short enough for a progress line or a status file."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300]}" if text else type(exc).__name__


class PhaseProgress:
    """What a phase reports through: progress(done, total, **details) emits one PROGRESS event."""

    def __init__(self, phase: str, unit: str = ""):
        self.phase, self.unit = phase, unit

    def __call__(self, done: int, total: int, **detail) -> None:
        emit(Event(self.phase, PROGRESS, done=done, total=total, unit=self.unit, detail=detail))

    def step(self, message: str, **detail) -> None:
        step(self.phase, message, **detail)

    def waiting(self, message: str, waited_s: float, **detail) -> None:
        waiting(self.phase, message, waited_s, **detail)


# ---- folding events into a view ----------------------------------------------------------------

@dataclass
class PhaseView:
    phase: str
    started_at: float
    updated_at: float                 # last event of any kind
    progressed_at: float | None = None  # last time done changed
    done: int | None = None
    total: int | None = None
    unit: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    activity: str = ""                # the step running or the thing waited on
    activity_since: float | None = None
    waiting: bool = False
    rate: float | None = None         # units per second over the last RATE_WINDOW_S
    eta_s: float | None = None
    finished_at: float | None = None
    ok: bool | None = None
    message: str = ""                 # the end message

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PhaseView":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class Tracker:
    """One view per phase, the current phase, and a rate from a sliding window of samples."""

    def __init__(self):
        self.views: dict[str, PhaseView] = {}
        self.current: str | None = None
        self._samples: dict[str, deque] = {}

    def apply(self, e: Event) -> PhaseView:
        v = self.views.get(e.phase)
        if v is None or (e.kind == START and v.finished_at is not None):
            v = self.views[e.phase] = PhaseView(e.phase, started_at=e.at, updated_at=e.at)
            self._samples[e.phase] = deque()
        v.updated_at = e.at
        self.current = e.phase
        if e.kind == PROGRESS:
            self._progress(v, e)
        elif e.kind in (STEP, WAIT):
            new = e.message and e.message != v.activity
            v.activity, v.waiting = e.message or v.activity, e.kind == WAIT
            if new or v.activity_since is None:
                v.activity_since = e.at - float(e.detail.get("waited_s", 0.0))
            v.detail.update({k: val for k, val in e.detail.items() if k != "waited_s"})
        elif e.kind == END:
            v.finished_at, v.ok, v.message, v.waiting, v.eta_s = e.at, e.ok, e.message, False, None
            v.detail.update(e.detail)
        elif e.kind in (NOTE, START) and v.waiting:  # a note ("ready after 45 s") or a new start ends a wait
            v.activity, v.activity_since, v.waiting = "", None, False
        return v

    def _progress(self, v: PhaseView, e: Event) -> None:
        if e.done is not None and e.done != v.done:
            v.progressed_at = e.at
            if v.waiting:  # whatever was waited on has arrived
                v.activity, v.activity_since, v.waiting = "", None, False
        v.done, v.total = e.done, e.total
        v.unit = e.unit or v.unit
        v.detail.update(e.detail)
        samples = self._samples.setdefault(v.phase, deque())
        if e.done is not None:
            samples.append((e.at, e.done))
        while len(samples) > 2 and e.at - samples[0][0] > RATE_WINDOW_S:
            samples.popleft()
        if len(samples) >= 2 and samples[-1][0] > samples[0][0] and samples[-1][1] > samples[0][1]:
            v.rate = (samples[-1][1] - samples[0][1]) / (samples[-1][0] - samples[0][0])
        if v.rate and v.total is not None and v.done is not None:
            v.eta_s = max(0.0, (v.total - v.done) / v.rate)

    def current_view(self) -> PhaseView | None:
        return self.views.get(self.current) if self.current else None


# ---- one line per view -------------------------------------------------------------------------

def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fmt_rate(rate: float, unit: str) -> str:
    """Per second, or per minute / hour when that reads better (bench windows take minutes)."""
    unit = unit or "items"
    for per, scale in (("s", 1), ("min", 60), ("h", 3600)):
        if rate * scale >= 0.95 or per == "h":
            value = rate * scale
            return f"{value:.2f} {unit}/{per}" if value < 10 else f"{value:.0f} {unit}/{per}"
    return ""


def eta_left(v: "PhaseView", now: float) -> float | None:
    """The ETA counted down since the progress it was computed from (negative once overdue)."""
    if v.eta_s is None:
        return None
    return v.eta_s - (now - (v.progressed_at if v.progressed_at is not None else now))


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def describe_detail(d: dict[str, Any]) -> str:
    """The details a phase reports, in words (known keys first; anything else as key=value)."""
    parts, seen = [], set()

    def take(*keys):
        seen.update(keys)
        return [d.get(k) for k in keys]

    tok_s, failed = take("tok_s", "failed")
    if tok_s is not None:
        parts.append(f"{tok_s:.1f} tok/s")
    if failed:
        parts.append(f"{failed} failed")
    written, expected, free = take("bytes_written", "bytes_expected", "disk_free")
    if written is not None:
        parts.append(f"{fmt_bytes(written)}" + (f" of {fmt_bytes(expected)}" if expected else "") + " written")
    if free is not None:
        parts.append(f"{fmt_bytes(free)} free")
    epoch, epochs, step_, loss = take("epoch", "epochs", "step", "loss")
    if epoch is not None:
        parts.append(f"epoch {epoch}" + (f"/{epochs}" if epochs else ""))
    if step_ is not None:
        parts.append(f"step {step_}")
    if loss is not None:
        parts.append(f"loss {loss:.4g}" if isinstance(loss, (int, float)) else f"loss {loss}")
    seen.update(("window", "k", "concurrency", "waited_s"))
    parts += [f"{k}={v}" for k, v in d.items() if k not in seen and not isinstance(v, (dict, list))]
    return ", ".join(parts)


def describe(v: PhaseView, now: float | None = None, stale_after_s: float | None = None) -> str:
    """e.g. `32/64 samples (50%), 2.1 samples/s, ETA 15 s; 412.0 tok/s` or
    `waiting for vllm server readiness 45 s`."""
    now = time.time() if now is None else now
    if v.finished_at is not None:
        took = fmt_duration(v.finished_at - v.started_at)
        state = "done" if v.ok else "INTERRUPTED" if v.message.startswith(INTERRUPTED) else "FAILED"
        return f"{state} in {took}" + (f": {v.message}" if v.message else "")
    parts = []
    if v.total:
        pct = f" ({100.0 * (v.done or 0) / v.total:.0f}%)"
        parts.append(f"{v.done or 0}/{v.total} {v.unit}".rstrip() + pct)
        if v.rate:
            parts.append(fmt_rate(v.rate, v.unit))
        left = eta_left(v, now)
        if left is not None and (v.done or 0) < v.total:
            parts.append(f"ETA {fmt_duration(left)}" if left >= 0 else f"ETA passed {fmt_duration(-left)} ago")
    text = ", ".join(parts)
    extra = describe_detail(v.detail)
    if extra:
        text = f"{text}; {extra}" if text else extra
    if v.activity:
        since = fmt_duration(now - v.activity_since) if v.activity_since is not None else ""
        act = f"{v.activity} {since}" if v.waiting else f"{v.activity} ({since})"
        return f"{text} | {act}" if text else act
    if not text:
        return f"running for {fmt_duration(now - v.started_at)}, no progress reported yet"
    last = v.progressed_at or v.started_at
    if stale_after_s is not None and now - last >= stale_after_s:
        text += f" (no new progress for {fmt_duration(now - last)})"
    return text
