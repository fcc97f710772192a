"""The phase contract: run_phase takes the phase's lock once around the body, and a phase returns
a PhaseSummary, recorded in the DONE marker as its dict."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3 import phase_table
from eagle3.phase_table import PIPELINE, with_runs
from eagle3.phases import PhaseSummary, RunDirBusy, phase_lock
from eagle3.phase_runner import done_marker, run_phase, supervisor

SEEN: dict[str, object] = {}


def locked_phase(cfg, sup) -> PhaseSummary:
    """Tries the phase lock from inside the body: held by run_phase, so refused."""
    try:
        with phase_lock(cfg, "datagen"):
            SEEN["lock"] = "free"
    except RunDirBusy:
        SEEN["lock"] = "held"
    out = cfg.phase_dir("datagen") / "out.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("x\n")
    return PhaseSummary(out, "one line", {"path": Path("/p"), "n": 1})


def dict_phase(cfg, sup) -> dict:
    return {"n": 1}


def test_run_phase_holds_the_lock_and_records_the_summary(make_config):
    cfg = make_config(check_files=False)
    with phase_table.using(with_runs({"datagen": f"{__name__}:locked_phase"}, PIPELINE)):
        marker = run_phase(cfg, "datagen", supervisor(cfg))
    assert SEEN["lock"] == "held", "the body runs under the phase lock"
    assert marker.summary == {"output": str(cfg.phase_dir("datagen") / "out.txt"), "headline": "one line",
                                 "details": {"path": "/p", "n": 1}}
    assert done_marker(cfg, "datagen") == marker
    with phase_lock(cfg, "datagen"):  # released after the phase
        pass


def test_a_second_runner_of_the_phase_is_refused_before_the_body_runs(make_config):
    cfg = make_config(check_files=False)
    SEEN.clear()
    with phase_table.using(with_runs({"datagen": f"{__name__}:locked_phase"}, PIPELINE)):
        with phase_lock(cfg, "datagen"):
            with pytest.raises(RunDirBusy, match="another datagen phase is running"):
                run_phase(cfg, "datagen", supervisor(cfg))
    assert "lock" not in SEEN and done_marker(cfg, "datagen") is None


def test_a_phase_returning_something_else_is_refused_without_a_marker(make_config):
    cfg = make_config(check_files=False)
    with phase_table.using(with_runs({"datagen": f"{__name__}:dict_phase"}, PIPELINE)):
        with pytest.raises(TypeError, match="returned dict; a phase returns an eagle3.phases.PhaseSummary"):
            run_phase(cfg, "datagen", supervisor(cfg))
    assert done_marker(cfg, "datagen") is None
