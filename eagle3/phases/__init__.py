"""The pipeline's phases, each a plain function over the config (no orchestrator imports here).

The phase contract (eagle3.phase_table.Phase.run): `function(cfg, sup, **options) -> PhaseSummary`;
its progress goes to the event bus (eagle3.progress.PhaseProgress), whoever listens.
eagle3.phase_runner.run_phase does the rest once around it: the phase lock, progress start/end, the
upstream check, the DONE marker and its fingerprint.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import PipelineError
from ..fsio import file_lock


class RunDirBusy(PipelineError):
    """Another process is running this phase on the same run dir."""

    exit_code = 3  # busy, as a held lease (eagle3.process.lease.LeaseBusy)


@contextlib.contextmanager
def exclusive_phase_dir(lock: Path, who: str) -> Iterator[None]:
    """Hold the phase dir's lock for the whole body. Only a failure to *take* the lock becomes
    RunDirBusy; a BlockingIOError raised later by the body itself stays what it is."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(lock, blocking=False))
        except BlockingIOError:
            raise RunDirBusy(f"{Path(lock).parent}: another {who} is running on this run dir; "
                             "wait for it to finish or stop it, then rerun") from None
        yield


@contextlib.contextmanager
def phase_lock(cfg, phase: str) -> Iterator[None]:
    """The one lock a phase runs under (state/<phase>.lock), taken by eagle3.phase_runner.run_phase
    (every way of running a phase goes through it), never by the phase body: a second process on
    the same phase gets RunDirBusy at once (the lock is not re-entrant across file descriptors, so
    the same process must not take it twice)."""
    with exclusive_phase_dir(cfg.layout.phase_lock(phase), f"{phase} phase"):
        yield


@dataclass(frozen=True)
class PhaseSummary:
    """What every phase returns: its main output (a file or dir), one line saying what it did
    (the single-phase commands print it, the Prefect artifact shows it), and the phase's own
    numbers and paths. The DONE marker records `to_dict()`."""

    output: str
    headline: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # Details are JSON in the marker: a Path or a number type of a library becomes its text.
        return {"output": str(self.output), "headline": self.headline,
                "details": json.loads(json.dumps(self.details, default=str))}
