"""Error taxonomy. The orchestrator retries only what `retryable` marks as transient."""

from __future__ import annotations

import reprlib
from typing import Any


class PipelineError(Exception):
    """Base of every error the pack raises on purpose. `exit_code`: the CLI's exit status for it
    (mapped in one place, eagle3/cli/common.py: exit_code)."""

    retryable = False
    exit_code = 1  # a step failed (a gate, a handoff, a service, the doctor)


class ConfigError(PipelineError):
    """Bad input: retrying cannot help; the message names the field and the fix."""

    exit_code = 2


class GateError(PipelineError):
    """A check on a produced artifact failed (checkpoint keys, acceptance floor, ...)."""


class HandoffError(PipelineError):
    """GPUs could not be proven free; the next phase must not start. `report` is the handoff's
    HandoffReport (eagle3.handoff.core) when the handoff got far enough to write one, else None
    (typed loosely: the error taxonomy sits below every layer and imports none of them)."""

    def __init__(self, message: str, report: Any = None):
        super().__init__(message)
        self.report = report


class ServiceError(PipelineError):
    """A supervised process failed. Carries the tail of its log for the report."""

    retryable = True

    def __init__(self, message: str, log_tail: str = ""):
        super().__init__(message if not log_tail else f"{message}\n--- log tail ---\n{log_tail}")
        self.log_tail = log_tail


class ServiceExited(ServiceError):
    """The process exited while it was expected to run or become ready."""


class ServiceStartTimeout(ServiceError):
    """Readiness did not come within the startup budget."""


class ServiceHung(ServiceError):
    """The watchdog saw no progress (no log growth, no readiness or output progress, GPU memory still)."""


class CommandFailed(ServiceError):
    """A one-shot supervised command exited non-zero."""

    def __init__(self, message: str, log_tail: str = "", returncode: int | None = None, retryable: bool = False):
        super().__init__(message, log_tail)
        self.returncode = returncode
        self.retryable = retryable


class TransientError(PipelineError):
    """Connection lost, server died mid-phase, ... : a rerun resumes."""

    retryable = True


class TrainingStopped(TransientError):
    """The trainer was stopped before the last epoch; its interrupt checkpoint makes a rerun resume."""


def echo(value, limit: int = 80, quote: bool = True) -> str:
    """`value` as a message may show it: at most `limit` characters, and never a walk of a whole
    structure (a few items of the first levels only), whatever size the value has."""
    if isinstance(value, str) and not quote:
        text = value[: limit + 1]
    else:
        try:
            text = _REPR.repr(value)
        except ValueError:  # an int beyond Python's digit limit for str()
            text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring, _REPR.maxlong, _REPR.maxother = 200, 40, 200
