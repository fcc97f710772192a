"""Exit codes live on the error classes and are mapped in one place (eagle3/cli/common.py: exit_code)."""

from __future__ import annotations

from eagle3.cli.common import exit_code
from eagle3.doctor import DoctorFailed
from eagle3.errors import ConfigError, GateError, HandoffError, ServiceExited, TransientError
from eagle3.owned import NotOwned
from eagle3.phases import RunDirBusy
from eagle3.process.lease import LeaseBusy


def test_each_kind_of_failure_has_its_code():
    assert [exit_code(e) for e in (ConfigError("x"), NotOwned.__new__(NotOwned))] == [2, 2]
    assert [exit_code(e) for e in (GateError("x"), HandoffError("x"), ServiceExited("x"), TransientError("x"),
                                   DoctorFailed.__new__(DoctorFailed), RuntimeError("x"))] == [1] * 6
    assert [exit_code(e) for e in (LeaseBusy("x", None), RunDirBusy("x"))] == [3, 3]
