"""Failure signatures: two runs of one bug compare equal; different bugs do not."""

from __future__ import annotations

from eagle3.run import failures
from eagle3.errors import CommandFailed, ServiceExited


def test_same_failure_with_other_pids_and_paths_has_one_signature():
    a = ServiceExited("server exited with code 1 before it was ready",
                      "INFO loading\nRuntimeError: shape '[-1, 384]' is invalid for input of size 1024 (pid 4711)\n")
    b = ServiceExited("server exited with code 1 before it was ready",
                      "INFO loading\nRuntimeError: shape '[-1, 384]' is invalid for input of size 2048 (pid 99)\n")
    assert failures.signature(a) == failures.signature(b)


def test_different_failures_differ():
    a = ServiceExited("x", "RuntimeError: Model does not support EAGLE3 interface")
    b = ServiceExited("x", "NCCL error: unhandled system error")
    c = CommandFailed("x", "RuntimeError: Model does not support EAGLE3 interface", returncode=1)
    assert len({failures.signature(e) for e in (a, b, c)}) == 3


def test_record_says_repeated_only_for_two_in_a_row(tmp_path):
    crash = ServiceExited("x", "Traceback\nEngineDeadError: engine core died at /tmp/a/b.py:12")
    hang = ServiceExited("x", "no log output for 600 s")
    assert failures.record(tmp_path, "datagen", crash) is False
    assert failures.record(tmp_path, "datagen", hang) is False
    assert failures.record(tmp_path, "datagen", hang) is True
    assert failures.record(tmp_path, "extract", hang) is False  # per phase
    failures.clear(tmp_path, "datagen")
    assert failures.record(tmp_path, "datagen", hang) is False
