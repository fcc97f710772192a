"""Extraction progress: hidden-state files done, the bytes they hold and the free space left."""

from __future__ import annotations

import shutil

from eagle3 import progress
from eagle3.phases.extract_progress import HsFileProgress
from eagle3.progress import PROGRESS, PhaseProgress


def test_watcher_reports_files_bytes_and_free_space(tmp_path):
    hs = tmp_path / "hidden_states"
    hs.mkdir()
    (hs / "hs_0.safetensors").write_bytes(b"x" * 1000)  # kept from an earlier run: counts from the start
    events, calls = [], []
    with progress.subscribed(events.append), progress.subscribed(progress.counts("extract", lambda d, t: calls.append((d, t)))):
        with HsFileProgress(hs, 4, PhaseProgress("extract", unit="samples"),
                              expected_bytes=4000):
            for i in (1, 2):
                (hs / f"hs_{i}.safetensors").write_bytes(b"x" * 1000)
            (hs / "hs_9.safetensors").write_bytes(b"x" * 5000)   # beyond the dataset: not counted
            (hs / "notes.txt").write_text("stray")
    ends = [e for e in events if e.kind == PROGRESS]
    first, last = ends[0], ends[-1]
    assert (first.done, first.detail["bytes_written"]) == (1, 1000)
    assert (last.done, last.total, last.unit) == (3, 4, "samples")
    assert last.detail["bytes_written"] == 3000 and last.detail["bytes_expected"] == 4000
    assert 0 < last.detail["disk_free"] <= shutil.disk_usage(hs).total
    assert calls[0] == (1, 4) and calls[-1] == (3, 4)  # a caller's on_progress(done, total) gets the same
