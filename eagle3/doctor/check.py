"""What one preflight check says (PASS / WARN / FAIL, why, the fix), and the error a failed preflight raises."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PipelineError

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


@dataclass
class Check:
    name: str
    status: str
    reason: str
    fix: str = ""
    seconds: float = 0.0


class DoctorFailed(PipelineError):
    """At least one preflight check failed: the run must not start. Its message is one line (the
    first cause and its fix); each failed check is a line of the doctor's own output (and of the
    preflight task's log) with its fix, so no message says any of them twice."""

    def __init__(self, checks: list[Check]):
        bad = [c for c in checks if c.status == FAIL]
        more = f" (and {len(bad) - 1} more failed check(s), each logged with its fix)" if len(bad) > 1 else ""
        first = bad[0] if bad else None
        head = (f"preflight failed: {first.name}: {first.reason}" + (f"; fix: {first.fix}" if first.fix else "")
                if first else "preflight failed")
        super().__init__(head + more)
        self.checks = checks
