"""Progress events: the views they fold into (rate, ETA, waits), the lines they print, the status
file they are throttled into, and the places that emit them (server readiness, handoffs)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from eagle3 import progress
from eagle3.errors import ServiceStartTimeout
from eagle3.progress import END, NOTE, PROGRESS, START, STEP, WAIT, Event, PhaseProgress, Tracker, describe
from eagle3.progress.display import Display, LinePrinter, LiveDisplay, interval_s, unattended_lines
from eagle3.run.record import StatusFile


class Collect:
    def __init__(self):
        self.events: list[Event] = []

    def __call__(self, e: Event) -> None:
        self.events.append(e)


# ---- folding and describing ----------------------------------------------------------------

def test_rate_and_eta_follow_the_progress():
    t = Tracker()
    t.apply(Event("datagen", START, at=100.0))
    t.apply(Event("datagen", PROGRESS, done=10, total=64, unit="samples", at=100.0))
    v = t.apply(Event("datagen", PROGRESS, done=30, total=64, unit="samples", detail={"tok_s": 412.0}, at=110.0))
    assert v.rate == pytest.approx(2.0) and v.eta_s == pytest.approx(17.0)
    line = describe(v, now=111.0)  # the ETA counts down from the last progress
    assert line == "30/64 samples (47%), 2.00 samples/s, ETA 16 s; 412.0 tok/s", line
    assert "ETA passed 13 s ago" in describe(v, now=140.0)


def test_slow_rates_read_per_minute():
    t = Tracker()
    t.apply(Event("bench", PROGRESS, done=1, total=6, unit="windows", at=0.0))
    v = t.apply(Event("bench", PROGRESS, done=2, total=6, unit="windows", at=40.0))
    assert describe(v, now=40.0).startswith("2/6 windows (33%), 1.50 windows/min, ETA 2 min 40 s")


def test_a_wait_counts_up_and_ends_with_progress_or_a_note():
    t = Tracker()
    t.apply(Event("extract", START, at=0.0))
    t.apply(Event("extract", WAIT, message="waiting for vllm server readiness", detail={"waited_s": 1.0}, at=1.0))
    v = t.apply(Event("extract", WAIT, message="waiting for vllm server readiness", detail={"waited_s": 44.0}, at=44.0))
    assert describe(v, now=45.0) == "waiting for vllm server readiness 45 s"
    v = t.apply(Event("extract", NOTE, message="vllm server ready after 45 s", at=45.5))
    assert not v.waiting and v.activity == ""
    t.apply(Event("run", WAIT, message="waiting for the run's Prefect server", detail={"waited_s": 3.0}, at=46.0))
    assert t.current == "run" and "Prefect server" in describe(t.current_view(), now=47.0)
    assert t.apply(Event("run", START, message="pipeline x", at=48.0)).activity == ""
    t.apply(Event("extract", WAIT, message="waiting for something else", detail={"waited_s": 0.0}, at=50.0))
    v = t.apply(Event("extract", PROGRESS, done=1, total=8, unit="samples", at=51.0))
    assert not v.waiting and "waiting" not in describe(v, now=52.0)


def test_end_and_restart_of_a_phase():
    t = Tracker()
    t.apply(Event("train", START, at=0.0))
    v = t.apply(Event("train", END, ok=False, message="TransientError: server died", at=65.0))
    assert describe(v) == "FAILED in 1 min 05 s: TransientError: server died"
    v = t.apply(Event("train", START, at=70.0))  # the retry starts a fresh view
    assert v.finished_at is None and v.started_at == 70.0


def test_details_in_words():
    t = Tracker()
    t.apply(Event("extract", PROGRESS, done=3, total=8, unit="samples", at=0.0,
                  detail={"bytes_written": 3 * 2**30, "bytes_expected": 8 * 2**30, "disk_free": 100 * 2**30}))
    assert "3.0 GiB of 8.0 GiB written, 100.0 GiB free" in describe(t.views["extract"], now=1.0)
    t.apply(Event("train", PROGRESS, done=1, total=3, unit="epochs", at=0.0,
                  detail={"epoch": 2, "epochs": 3, "step": 120, "loss": 2.3141}))
    assert "1/3 epochs (33%); epoch 2/3, step 120, loss 2.314" in describe(t.views["train"], now=1.0)


def test_no_progress_yet_and_stale_progress_are_said():
    t = Tracker()
    v = t.apply(Event("train", START, at=0.0))
    assert describe(v, now=75.0) == "running for 1 min 15 s, no progress reported yet"
    v = t.apply(Event("train", PROGRESS, done=1, total=3, unit="epochs", at=10.0))
    assert describe(v, now=50.0, stale_after_s=30.0).endswith("(no new progress for 40 s)")


# ---- the hub -----------------------------------------------------------------------------------

def test_phase_progress_emits_events_and_a_callers_on_progress_gets_its_phases_counts():
    calls, seen = [], Collect()
    with progress.subscribed(seen), progress.subscribed(progress.counts("bench", lambda d, t: calls.append((d, t)))):
        progress.emit(progress.Event("datagen", PROGRESS, done=1, total=9))  # another phase's: not this caller's
        report = PhaseProgress("bench", unit="windows")
        report(2, 6, window=3)
        report.step("window 3/6: k=1, concurrency 4")
    assert calls == [(2, 6)]
    assert [(e.kind, e.done, e.total, e.unit) for e in seen.events][1:] == [(PROGRESS, 2, 6, "windows"), (STEP, None, None, "")]
    assert seen.events[2].message == "window 3/6: k=1, concurrency 4"


def test_a_failing_sink_never_fails_the_emitter_nor_the_other_sinks():
    seen = Collect()

    def broken(e):
        raise RuntimeError("display bug")

    with progress.subscribed(broken), progress.subscribed(seen):
        progress.step("datagen", "still here")
    assert [e.message for e in seen.events] == ["still here"]


def test_unattended_lines_only_when_no_display_watches():
    lines: list[str] = []
    with unattended_lines(lines.append):
        progress.step("datagen", "logged")
    assert lines == ["datagen: logged"]
    shown: list[str] = []
    with LinePrinter(shown.append, interval=60) as display, progress.subscribed(display):
        with unattended_lines(lines.append):
            progress.step("datagen", "shown once")
    assert lines == ["datagen: logged"] and [s.split(" ", 1)[1] for s in shown] == ["datagen: shown once"]


def test_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("EAGLE3_PROGRESS_INTERVAL_S", "2.5")
    assert interval_s() == 2.5
    monkeypatch.setenv("EAGLE3_PROGRESS_INTERVAL_S", "nonsense")
    assert interval_s() == 30.0


# ---- plain lines ---------------------------------------------------------------------------------

def test_line_printer_prints_discrete_events_at_once_and_a_heartbeat_every_interval():
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    with LinePrinter(lambda s: lines.append((time.monotonic() - t0, s)), interval=0.3, stamp=False) as p:
        with progress.subscribed(p):
            progress.emit(Event("datagen", START, message="started"))
            PhaseProgress("datagen", unit="samples")(1, 10)      # progress prints nothing by itself
            progress.emit(Event("handoff", START, quiet=True, message="proving GPUs free"))
            progress.waiting("extract", "waiting for vllm server readiness", 0.0)
            progress.waiting("extract", "waiting for vllm server readiness", 0.5)  # same wait: no new line
            time.sleep(1.05)
            progress.emit(Event("extract", END, message="output abc"))
    texts = [s for _, s in lines]
    assert texts[:2] == ["datagen: started", "extract: waiting for vllm server readiness"]
    beats = [(t, s) for t, s in lines if s.startswith("extract: waiting for vllm server readiness ")]
    assert len(beats) >= 2, texts  # the wait's state, repeated while nothing else is printed
    assert texts[-1].startswith("extract: done in 1 s: output abc")
    gaps = [b[0] - a[0] for a, b in zip(lines, lines[1:])]
    assert max(gaps) <= 0.3 + 0.35, gaps
    assert not any("proving GPUs free" in s for s in texts[:3])


def test_servers_waited_on_side_by_side_print_one_line_each_not_one_per_turn():
    """Two servers started at once take turns reporting their waits (2026-12-06's demo log printed ~140
    lines in 40 s): each wait prints once until the phase prints something else, then may again."""
    lines: list[str] = []
    with LinePrinter(lines.append, interval=60, stamp=False) as p:
        with progress.subscribed(p):
            for i in range(20):
                progress.waiting("bench", "waiting for vllm server readiness (PID 1)", i / 4)
                progress.waiting("bench", "waiting for vllm server readiness (PID 2)", i / 4)
            progress.note("bench", "vllm server ready after 5.0 s (PID 1)")
            progress.waiting("bench", "waiting for vllm server readiness (PID 2)", 5.5)
    assert lines == ["bench: waiting for vllm server readiness (PID 1)", "bench: waiting for vllm server readiness (PID 2)",
                     "bench: vllm server ready after 5.0 s (PID 1)", "bench: waiting for vllm server readiness (PID 2)"]


def test_live_display_renders_every_phase(monkeypatch):
    from io import StringIO

    from rich.console import Console

    console = Console(file=StringIO(), force_terminal=True, width=160)
    d = LiveDisplay(console)
    d(Event("datagen", START))
    d(Event("datagen", PROGRESS, done=32, total=64, unit="samples", detail={"tok_s": 12.5}))
    d(Event("extract", WAIT, message="waiting for vllm server readiness", detail={"waited_s": 3.0}))
    d(Event("handoff", START, quiet=True, message="extract-to-train: proving GPUs free"))
    d(Event("handoff", END, message="extract-to-train: GPUs free"))
    d(Event("preflight", START, message="doctor"))
    assert "handoff: done in 0 s: extract-to-train: GPUs free" in console.file.getvalue()  # lines above the view
    screen = Console(file=StringIO(), width=160, color_system=None)
    screen.print(d)  # the live view itself
    rows = screen.file.getvalue().splitlines()
    assert [r.split()[0] for r in rows] == ["datagen", "extract", "preflight"], rows  # a finished handoff: no row
    assert "32/64 samples (50%)" in rows[0] and "waiting for vllm server readiness" in rows[1]
    assert isinstance(d, Display)


# ---- the status file ---------------------------------------------------------------------------

def test_status_file_is_throttled_but_writes_starts_and_ends_at_once(tmp_path):
    path = tmp_path / "progress.json"
    sink = StatusFile(path, every_s=0.5)
    sink(Event("datagen", START))
    for i in range(1, 51):
        sink(Event("datagen", PROGRESS, done=i, total=100))
    assert json.loads(path.read_text())["phases"]["datagen"]["done"] is None  # throttled: still the start's state
    time.sleep(0.55)
    sink(Event("datagen", PROGRESS, done=60, total=100))
    assert json.loads(path.read_text())["phases"]["datagen"]["done"] == 60
    sink(Event("datagen", END, message="output x"))
    data = json.loads(path.read_text())
    assert data["phases"]["datagen"]["finished_at"] is not None and data["current"] == "datagen"
    assert not list(tmp_path.glob(".progress.json.*")), "a temp file was left behind"


# ---- emitters ----------------------------------------------------------------------------------

def test_wait_ready_calls_its_heartbeat_while_waiting(tmp_path):
    from eagle3.process.services import LaunchSpec, LogProbe, Supervisor
    from tests.procutil import PY

    sup = Supervisor(tmp_path / "state")
    code = "import time; time.sleep(1.2); print('READY', flush=True); time.sleep(60)"
    proc = sup.launch(LaunchSpec(name="slow", argv=[PY, "-c", code], log=tmp_path / "slow.log"))
    beats: list[float] = []
    try:
        waited = proc.wait_ready([LogProbe(proc.spec.log, r"^READY$")], timeout_s=20, poll_s=0.1, on_wait=beats.append)
    finally:
        proc.stop(1)
    assert len(beats) >= 5 and beats == sorted(beats) and beats[-1] <= waited


def test_server_startup_is_a_wait_then_a_ready_note(tmp_path):
    from eagle3.engines.serving import start_server
    from eagle3.phase_runner import supervisor
    from tests.reliability.standins import standin_config

    seen = Collect()
    with progress.subscribed(seen):
        cfg = standin_config(tmp_path / "never", env={"STANDIN_MODE": "never-200"},
                             overrides={"datagen": {"server": {"startup_timeout_s": 2}}})
        with pytest.raises(ServiceStartTimeout):
            start_server(supervisor(cfg), cfg, "datagen", "vllm", cfg.datagen.server)
        waits = [e for e in seen.events if e.kind == WAIT]
        assert len(waits) >= 3 and all(e.phase == "datagen" for e in waits)
        assert waits[0].message.startswith("waiting for vllm server readiness (PID ")
        assert [e.detail["waited_s"] for e in waits] == sorted(e.detail["waited_s"] for e in waits)

        cfg = standin_config(tmp_path / "ok", env={"STANDIN_MODE": "ok"})
        sup = supervisor(cfg)
        proc = start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
        proc.stop()
    notes = [e for e in seen.events if e.kind == NOTE]
    assert len(notes) == 1 and notes[0].message.startswith("vllm server ready after ")


def test_a_handoff_is_one_line(tmp_path, make_config):
    from eagle3.handoff.core import handoff_for_config

    cfg = make_config(check_files=False)
    lines: list[str] = []
    with LinePrinter(lines.append, interval=60, stamp=False) as p, progress.subscribed(p):
        handoff_for_config(cfg, after="datagen")
    assert len(lines) == 1, lines
    assert lines[0].startswith("handoff: done in ") and "datagen-to-extract: GPUs free" in lines[0]


def test_emit_is_safe_from_many_threads(tmp_path):
    sink = StatusFile(tmp_path / "p.json", every_s=0.0)
    report = PhaseProgress("extract", unit="samples")
    with progress.subscribed(sink):
        threads = [threading.Thread(target=lambda i=i: [report(j, 100) for j in range(i, 100, 4)]) for i in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert json.loads((tmp_path / "p.json").read_text())["phases"]["extract"]["total"] == 100
