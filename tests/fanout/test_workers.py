"""Whether a pool can start a shard, in the operator's words (issue 57): no worker, a worker lost (its
last heartbeat older than the stated bound), a worker busy with another run, one that will pick it up.
The same classification runs against a real Prefect server and workers in
tests/flows/test_fanout_operator.py."""

from __future__ import annotations

import pytest

from eagle3.fanout import workers
from eagle3.fanout.workers import Worker

NOW = 1_000_000.0


def _w(status="ONLINE", age=1.0, interval=30):
    return Worker("w", status, NOW - age, interval)


def test_no_worker_is_named_as_such():
    view = workers.look("node-b", [], NOW)
    assert not view.online
    assert workers.waiting_words(view, None) == "waiting: pool node-b has no worker"


@pytest.mark.parametrize("interval, age, online", [(30, 59, True), (30, 61, False), (2, 3.9, True), (2, 4.1, False),
                                                   (None, 59, True), (None, 61, False)])
def test_a_worker_is_lost_after_two_of_its_own_heartbeat_intervals(interval, age, online):
    """Prefect still says ONLINE for three intervals and more (~93 s seen); the pack's bound is two."""
    assert workers.look("p", [_w(age=age, interval=interval)], NOW).online is online


def test_the_configured_bound_wins_and_prefects_offline_counts_at_once():
    assert not workers.look("p", [_w(age=11, interval=30)], NOW, configured_lost_after=10).online
    assert workers.look("p", [_w(age=9, interval=30)], NOW, configured_lost_after=10).online
    assert not workers.look("p", [_w(status="OFFLINE", age=1)], NOW).online


def test_dead_and_busy_read_differently():
    dead = workers.look("node-b", [_w(age=75)], NOW)
    assert workers.waiting_words(dead, None) == (
        "waiting: the worker of pool node-b is lost (last heartbeat 75 s ago; counted lost after 60 s)")
    busy = workers.look("node-b", [_w(age=3)], NOW)
    assert workers.waiting_words(busy, "cfg: datagen shard 1/2 (attempt 1)") == (
        "waiting: the worker of pool node-b is busy (running 'cfg: datagen shard 1/2 (attempt 1)')")
    assert workers.waiting_words(busy, None) == "waiting for the worker of pool node-b to pick it up"


def test_of_several_workers_one_alive_is_enough_and_the_last_heard_names_the_loss():
    assert workers.look("p", [_w(age=500), _w(age=2)], NOW).online
    view = workers.look("p", [Worker("old", "OFFLINE", NOW - 900, 30), Worker("recent", "ONLINE", NOW - 70, 30)], NOW)
    assert "last heartbeat 70 s ago" in view.why_not()


def test_the_worst_wait_before_a_move_is_the_larger_bound_plus_one_look():
    assert workers.worst_wait_s(start_timeout_s=60, lost_after=60, poll_interval_s=2) == 62
    assert workers.worst_wait_s(start_timeout_s=10, lost_after=60, poll_interval_s=2) == 62
    assert workers.worst_wait_s(start_timeout_s=90, lost_after=4, poll_interval_s=0.5) == 90.5
