"""The shared background poller: ticks while inside the block, stops on exit, then one last tick
that sees what changed after the thread's last tick."""

from __future__ import annotations

import threading
import time

from eagle3.ticker import Ticker


class Counter(Ticker):
    def __init__(self, every_s: float):
        super().__init__(every_s, name="test-ticker")
        self.ticks: list[str] = []
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self.ticks.append(threading.current_thread().name)


def test_ticks_on_its_thread_while_inside_then_once_more_on_the_caller_after_exit():
    with Counter(0.01) as c:
        deadline = time.monotonic() + 5
        while len(c.ticks) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
    after_exit = list(c.ticks)
    assert after_exit[:3] == ["test-ticker"] * 3
    assert after_exit[-1] == threading.current_thread().name, "the last tick runs after the thread stopped"
    assert not c._thread.is_alive()
    time.sleep(0.05)
    assert c.ticks == after_exit, "no tick after the block"


def test_a_long_period_does_not_delay_the_exit():
    t0 = time.monotonic()
    with Counter(60) as c:
        pass
    assert time.monotonic() - t0 < 2
    assert c.ticks == [threading.current_thread().name]


class Quiet(Counter):
    def last_tick(self) -> None:
        self.ticks.append("last")


def test_last_tick_can_differ_from_tick():
    with Quiet(60) as q:
        pass
    assert q.ticks == ["last"]


def test_the_thread_runs_in_the_caller_s_context():
    """What a tick logs must reach the caller's handlers: an orchestrator's run context and settings
    are context variables (a Prefect flow's temporary_settings: without them a tick's log record
    started Prefect's own temporary server)."""
    import contextvars
    import threading

    from eagle3.ticker import Ticker
    from tests.procutil import wait_until

    var = contextvars.ContextVar("run", default=None)
    seen = []

    class Watch(Ticker):
        def tick(self) -> None:
            seen.append((var.get(), threading.current_thread().name))

    var.set("flow-run-1")
    with Watch(0.01, name="watch"):
        wait_until(lambda: seen, timeout=5, what="a tick")
    assert seen and all(v == "flow-run-1" for v, _ in seen)
    assert ("flow-run-1", "watch") in seen, "ticks ran on the ticker's own thread, in the caller's context"
