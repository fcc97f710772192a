"""The phase-dir lock: a second runner is told the dir is busy; the body's own errors pass through."""

from __future__ import annotations

import pytest

from eagle3.phases import RunDirBusy, exclusive_phase_dir


def test_second_holder_is_refused_and_body_errors_stay_themselves(tmp_path):
    lock = tmp_path / "phase" / ".lock"
    lock.parent.mkdir()
    with exclusive_phase_dir(lock, "extraction"):
        with pytest.raises(RunDirBusy, match="another extraction is running"):
            with exclusive_phase_dir(lock, "extraction"):
                pass
    with pytest.raises(BlockingIOError):  # not misreported as a busy run dir
        with exclusive_phase_dir(lock, "extraction"):
            raise BlockingIOError("a non-blocking socket inside the phase")
    with exclusive_phase_dir(lock, "extraction"):  # released after each use
        pass
