"""Showing a run's progress events: a live display on a terminal, plain lines anywhere else.

Plain lines (logs, CI, a Prefect worker): one line at once for each phase start and end, step,
handoff, and the start of a wait; and the current phase's state (done/total, rate, ETA, details,
what it waits on and for how long) whenever nothing was printed for `interval_s` (default 30 s,
EAGLE3_PROGRESS_INTERVAL_S). So a working run is never silent for longer than the interval.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Callable, Iterator

from .. import phase_table
from . import END, NOTE, START, STEP, WAIT, Event, Tracker, describe, emit, fmt_duration, subscribed, watched_by
from ..ticker import Ticker

INTERVAL_ENV = "EAGLE3_PROGRESS_INTERVAL_S"
MODE_ENV = "EAGLE3_PROGRESS"  # auto (default) | live | plain | off
DEFAULT_INTERVAL_S = 30.0


def interval_s() -> float:
    raw = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        value = DEFAULT_INTERVAL_S
    return value if value > 0 else DEFAULT_INTERVAL_S


class Display:
    """A sink that shows events to a person; with one subscribed, nobody else needs to log them."""

    def __init__(self):
        self.tracker = Tracker()
        self.lock = threading.RLock()
        # The waits each phase has printed since its last other line: servers started side by side take
        # turns reporting their waits, and each wait is worth one line, not one per turn.
        self.waits_said: dict[str, set[str]] = {}

    def line_for(self, e: Event, new_activity: bool) -> str | None:
        """The line an event prints at once, if any (progress and repeated waits print none)."""
        if e.quiet:
            return None
        said = self.waits_said.setdefault(e.phase, set())
        if e.kind == WAIT:
            if not new_activity or e.message in said:
                return None
            said.add(e.message)
            return f"{e.phase}: {e.message}"
        if e.kind in (START, STEP, NOTE, END):
            said.clear()
        v = self.tracker.views.get(e.phase)
        if e.kind == END:
            return f"{e.phase}: {describe(v)}"
        if e.kind in (START, STEP, NOTE) and e.message:
            return f"{e.phase}: {e.message}"
        if e.kind == START:
            return f"{e.phase}: started"
        return None

    def status_line(self, now: float, stale_after_s: float | None) -> str:
        v = self.tracker.current_view()
        if v is None:
            return "starting"
        if v.finished_at is not None:
            return f"after {v.phase}: next step pending ({fmt_duration(now - v.finished_at)} since {v.phase} ended)"
        return f"{v.phase}: {describe(v, now, stale_after_s)}"

    def apply(self, e: Event) -> bool:
        """Fold the event in; True when it starts a new activity (a new wait or step)."""
        before = self.tracker.views.get(e.phase)
        old = (before.activity, before.waiting) if before else None
        v = self.tracker.apply(e)
        return old != (v.activity, v.waiting)


class LinePrinter(Display, Ticker):
    def __init__(self, write: Callable[[str], None], interval: float | None = None, stamp: bool = True):
        Display.__init__(self)
        self.write, self.interval, self.stamp = write, interval or interval_s(), stamp
        Ticker.__init__(self, min(1.0, self.interval / 4), name="eagle3-progress", join_timeout_s=5)
        self._last = time.monotonic()

    def __call__(self, e: Event) -> None:
        with self.lock:
            new = self.apply(e)
            line = self.line_for(e, new)
            if line:
                self._print(line)

    def _print(self, line: str) -> None:
        self._last = time.monotonic()
        self.write(f"{time.strftime('%H:%M:%S')} {line}" if self.stamp else line)

    def tick(self) -> None:
        with self.lock:
            if time.monotonic() - self._last >= self.interval:
                self._print(self.status_line(time.time(), self.interval))

    def last_tick(self) -> None:
        pass  # the run's last event has printed its own line


class LiveDisplay(Display):
    """A rich live view on the terminal: a bar and a line per phase, redrawn twice a second (so
    waits count up on screen); discrete lines (starts, steps, ends) scroll above it."""

    def __init__(self, console=None):
        super().__init__()
        from rich.console import Console
        from rich.live import Live

        self.console = console or Console(stderr=True)
        self.live = Live(self, console=self.console, refresh_per_second=2, transient=True,
                         redirect_stdout=False, redirect_stderr=False)

    def __call__(self, e: Event) -> None:
        with self.lock:
            new = self.apply(e)
            line = self.line_for(e, new)
        if line:
            self.console.print(f"{time.strftime('%H:%M:%S')} {line}", markup=False, highlight=False, soft_wrap=True)

    def __rich__(self):
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        now = time.time()
        grid = Table.grid(padding=(0, 1))
        with self.lock:
            # A row per pipeline phase seen so far, plus the run-level step in progress (the run's
            # server, the doctor, a handoff) while there is one.
            phases = phase_table.names()
            views = [self.tracker.views[p] for p in phases if p in self.tracker.views]
            current = self.tracker.current_view()
            if current is not None and current.phase not in phases and current.finished_at is None:
                views.append(current)
            for v in views:
                if v.total:
                    bar = ProgressBar(total=v.total, completed=v.done or 0, width=24)
                else:
                    bar = ProgressBar(total=None, width=24, pulse=v.finished_at is None)
                grid.add_row(f"[bold]{v.phase:9s}[/]", bar, describe(v, now, DEFAULT_INTERVAL_S))
            if not views:
                grid.add_row("", "", "starting")
        return grid

    def __enter__(self) -> "LiveDisplay":
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.live.stop()


def _stderr_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@contextlib.contextmanager
def progress_display(mode: str | None = None, write: Callable[[str], None] = _stderr_line,
                     start: str = "starting the pipeline flow (Prefect)") -> Iterator[Display | None]:
    """Show every progress event of the block: live on a terminal, plain lines otherwise."""
    mode = (mode or os.environ.get(MODE_ENV) or "auto").lower()
    if mode == "off":
        yield None
        return
    if mode == "auto":
        mode = "live" if sys.stderr.isatty() else "plain"
    display: Display = LiveDisplay() if mode == "live" else LinePrinter(write)
    with display, subscribed(display):
        emit(Event("run", STEP, message=start))
        yield display


@contextlib.contextmanager
def unattended_lines(write: Callable[[str], None]) -> Iterator[None]:
    """Plain progress lines into `write` (e.g. a Prefect run logger), unless someone already
    shows them (the CLI's display), so an `eagle3 run` prints each line once."""
    if watched_by(Display):
        yield
        return
    printer = LinePrinter(write, stamp=False)
    with printer, subscribed(printer):
        yield
