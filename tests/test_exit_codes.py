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


def test_no_command_chooses_an_exit_code_itself():
    """Every exit of an `eagle3` command goes through an error class's code (common.fail_with, common.end):
    no site names a number, and an interrupt's 130 is mapped in the same place."""
    import re
    from pathlib import Path

    from eagle3.cli.common import INTERRUPTED

    allowed = {"exit_code(e)", "0 if failure is None else exit_code(failure)"}
    cli = Path(__file__).resolve().parents[1] / "eagle3" / "cli"
    exits = [(p.name, m.group(1)) for p in sorted(cli.glob("*.py"))
             for m in re.finditer(r"(?:typer\.Exit|sys\.exit)\(([^)]*\)?)\)", p.read_text())]
    assert exits and all(arg in allowed for _, arg in exits), exits
    assert not [p.name for p in cli.glob("*.py") if re.search(r"\bcode=", p.read_text())]
    assert exit_code(KeyboardInterrupt("signal 15")) == INTERRUPTED == 130
