"""Ending single processes by pidfd: SIGTERM, grace, SIGKILL; never a reused PID; a survivor of
SIGKILL named with its kernel state."""

from __future__ import annotations

import os
import signal
import time

import pytest

from eagle3.process import procfs
from eagle3.process.terminate import end_processes
from tests.procutil import DEAF, SLEEP, wait_until

pytestmark = pytest.mark.timeout(60)


def target(p):
    return (p.pid, procfs.start_ticks(p.pid), "test", "owned")


def test_polite_and_deaf_processes(spawner):
    polite, deaf = spawner.start(SLEEP), spawner.start(DEAF)
    t0 = time.monotonic()
    results = {r.pid: r for r in end_processes([target(polite), target(deaf)], grace_s=0.5)}
    assert 0.5 <= time.monotonic() - t0 < 5
    assert results[polite.pid].signal == "SIGTERM" and results[deaf.pid].signal == "SIGKILL"
    assert all(r.outcome == "exited" for r in results.values())
    assert polite.wait(5) == -signal.SIGTERM and deaf.wait(5) == -signal.SIGKILL


def test_pid_with_another_start_time_is_not_signalled(spawner):
    other = spawner.start(SLEEP)
    pid, ticks, cmd, why = target(other)
    [r] = end_processes([(pid, ticks - 1, cmd, why)], grace_s=0.2)
    assert r.signal == "skipped" and r.outcome == "not ours any more"
    assert other.poll() is None and procfs.alive(other.pid)


def test_already_gone_is_reported_not_an_error(spawner):
    p = spawner.start("pass", ready=False)
    p.wait()
    [r] = end_processes([(p.pid, 1, "x", "owned")], grace_s=0.2)
    assert r.signal in ("none", "skipped")


def test_task_state_reads_what_the_kernel_says(spawner):
    p = spawner.start(SLEEP)
    wait_until(lambda: procfs.task_state(p.pid).state == "S", what="state S (in time.sleep)")
    os.kill(p.pid, signal.SIGSTOP)
    stopped = wait_until(lambda: (s := procfs.task_state(p.pid)) and s.state == "T" and s, what="state T")
    assert stopped.wchan == "do_signal_stop"  # the kernel function a stopped task waits in
    assert stopped.describe() == "state T (stopped), wchan do_signal_stop"
    p.kill()
    p.wait(5)
    assert procfs.task_state(p.pid) is None


def test_survivor_of_sigkill_is_reported_with_its_kernel_state(spawner, monkeypatch, freezer):
    monkeypatch.setattr("eagle3.process.terminate.KILL_WAIT_S", 1.0)
    p = spawner.start(DEAF)
    freezer.freeze(p.pid)
    t0 = time.monotonic()
    [r] = end_processes([target(p)], grace_s=0.3)
    assert 1.3 <= time.monotonic() - t0 < 4
    assert (r.signal, r.outcome) == ("SIGKILL", "survived SIGKILL")
    assert r.state.startswith("state D (disk sleep: uninterruptible") and "wchan -" not in r.state
    assert procfs.alive(p.pid)
    freezer.thaw()  # the pending SIGKILL ends it now
    assert p.wait(5) == -signal.SIGKILL
