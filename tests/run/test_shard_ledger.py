"""A shard's done count comes from the files its output holds (issue 41: an extract shard that wrote all
its 32 files showed 0/32, its progress record reading done 0)."""

from __future__ import annotations

import json

from eagle3.run import shard_ledger as ledger
from eagle3.slices import Shard
from eagle3.layout import RunLayout


def _shard_layout(run_dir, shard: Shard) -> RunLayout:
    return RunLayout(ledger.shard_dir(run_dir, shard))


def test_an_extract_shard_that_wrote_every_file_counts_them_all(tmp_path):
    shard = Shard("extract", 1, 2)
    layout = _shard_layout(tmp_path, shard)
    layout.progress.parent.mkdir(parents=True)
    layout.progress.write_text(json.dumps({"phases": {"extract": {"done": 0, "total": 32}}}))
    files = layout.phase_dir("extract") / "hidden_states"
    files.mkdir(parents=True)
    for i in range(32):
        (files / f"hs_{i}.safetensors").write_bytes(b"x")
    (files / "hs_32.safetensors.tmp").write_bytes(b"x")  # not renamed into place: not written
    assert ledger.progress_of(tmp_path, shard) == (32, 32)


def test_a_datagen_shard_counts_its_complete_rows(tmp_path):
    shard = Shard("datagen", 0, 2)
    out = _shard_layout(tmp_path, shard).phase_dir("datagen")
    out.mkdir(parents=True)
    (out / "samples.jsonl").write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n{"id": 4, "conv')  # the last one half-written
    assert ledger.progress_of(tmp_path, shard) == (3, None)
    assert ledger.progress_of(tmp_path, Shard("datagen", 1, 2)) == (None, None), "nothing yet: nothing claimed"


def test_an_attempt_shows_no_progress_its_shard_made_before_it_started(tmp_path):
    """A forced rerun: the shard's record and files are the last run's until the new attempt runs."""
    shard = Shard("datagen", 0, 2)
    layout = _shard_layout(tmp_path, shard)
    layout.progress.parent.mkdir(parents=True)
    layout.progress.write_text(json.dumps({"phases": {"datagen": {"done": 12, "total": 12, "started_at": 100.0}}}))
    out = layout.phase_dir("datagen")
    out.mkdir(parents=True)
    (out / "samples.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(12)))
    assert ledger.progress_of(tmp_path, shard, since=200.0) == (None, None)
    assert ledger.progress_of(tmp_path, shard, since=50.0) == (12, 12)


def test_the_ledger_keeps_every_coordinator_runs_shards(tmp_path):
    entry = {"index": 0, "pool": "a", "attempt": 1, "state": "Completed", "earlier": []}
    moved = {**entry, "attempt": 2, "earlier": [{"index": 0, "pool": "b", "attempt": 1, "state": "moved"}]}
    ledger.write(tmp_path, "datagen", [moved], run="first")
    ledger.write(tmp_path, "datagen", [moved], run="first")  # the same run, later: no history entry
    ledger.write(tmp_path, "datagen", [entry], run="second")
    ledger.write(tmp_path, "datagen", [entry], run="third")
    record = ledger.read(tmp_path)["datagen"]
    assert record["run"] == "third" and record["shards"] == [entry]
    assert [h["run"] for h in record["history"]] == ["first", "second"]
    assert record["history"][0]["shards"] == [moved], "the first run's move is still there"
    assert ledger.lines(tmp_path, "datagen")[-1].startswith("earlier runs of this phase: 2")


def test_shard_dirs_numbered_from_0_are_refused_not_misread(tmp_path):
    """Under the numbering from 1, an old run dir's `1-of-2` (its second shard) would be read as the first."""
    assert ledger.legacy_dirs_problem(tmp_path, "datagen") is None
    (tmp_path / "shards" / "datagen" / "1-of-2").mkdir(parents=True)
    assert ledger.legacy_dirs_problem(tmp_path, "datagen") is None, "a dir of the numbering from 1"
    (tmp_path / "shards" / "datagen" / "0-of-2").mkdir()
    problem = ledger.legacy_dirs_problem(tmp_path, "datagen")
    assert problem and "numbered from 0" in problem and f"Remove {tmp_path / 'shards' / 'datagen'}" in problem
    assert ledger.legacy_dirs_problem(tmp_path, "extract") is None
