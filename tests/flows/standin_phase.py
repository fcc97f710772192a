"""A phase added to the pipeline by a test, the way a new capability adds one: this module (its
function) plus one row of the phase table. Nothing else in the pack names it. It runs after the
no-op bench phase (noop_phases.py) and writes a digest of that phase's output."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import noop_phases  # noqa: E402

from eagle3.phase_table import Phase  # noqa: E402
from eagle3.phases import PhaseSummary  # noqa: E402
from eagle3.progress import PhaseProgress  # noqa: E402

NAME = "digest"


def digest(cfg, sup, on_progress=None) -> PhaseSummary:
    source = cfg.phase_dir("bench") / "output.txt"
    out = cfg.phase_dir(NAME)
    out.mkdir(parents=True, exist_ok=True)
    value = hashlib.sha256(source.read_bytes()).hexdigest()
    (out / "digest.txt").write_text(value + "\n")
    PhaseProgress(NAME, on_progress, unit="files")(1, 1)
    return PhaseSummary(str(out / "digest.txt"), f"sha256 {value[:12]} of {source}", {"digest": value, "of": str(source)})


ROW = Phase(NAME, "bench", f"{__name__}:digest", "digest.txt: sha256 of the bench phase's output.txt")
TABLE = (*noop_phases.TABLE, ROW)
