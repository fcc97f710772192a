"""Issue 22: with `bench.drafter` set, the report said "the training data was generated at temperature
0.6": this config's datagen value, not what that drafter learned from. The note now comes from the
drafter's own provenance (the train manifest, or the eagle3-provenance.json the train phase writes beside
the checkpoint it serves), and says nothing where none is recorded."""

from __future__ import annotations

import json

from eagle3.bench.provenance import drafter_checksum
from eagle3.drafters.formats import PROVENANCE
from eagle3.phases import bench


def _drafter(tmp_path, provenance: dict | None):
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    if provenance is not None:
        (d / PROVENANCE).write_text(json.dumps(provenance))
    return d


def _note(monkeypatch, cfg, drafter: dict) -> str | None:
    monkeypatch.setattr(bench, "evaluate_parity", lambda *a, **k: {"status": "not applied", "message": "m"})
    gate = bench._parity(cfg, drafter, [{"k": 3, "probes": []}])
    return gate.get("note")


def test_a_bench_drafter_without_provenance_gets_no_temperature_claim(make_config, tmp_path, monkeypatch):
    d = _drafter(tmp_path, None)
    cfg = make_config({"bench": {"drafter": str(d)}, "datagen": {"sampling": {"temperature": 0.6}}}, check_files=False)
    drafter = bench.resolve_drafter(cfg)
    assert drafter["data"] is None and bench.training_temperature(drafter) is None
    assert _note(monkeypatch, cfg, drafter) is None  # 0.6 is this config's, not the drafter's


def test_a_bench_drafter_with_provenance_is_described_by_it(make_config, tmp_path, monkeypatch):
    d = _drafter(tmp_path, {"data": {"sampling": {"temperature": 0.8}, "samples": 64}})
    cfg = make_config({"bench": {"drafter": str(d)}, "datagen": {"sampling": {"temperature": 0.0}}}, check_files=False)
    drafter = bench.resolve_drafter(cfg)
    assert bench.training_temperature(drafter) == 0.8
    note = _note(monkeypatch, cfg, drafter)
    assert note and "generated at temperature 0.8, the benchmark serves at 0.0" in note


def test_same_temperature_no_note_and_the_provenance_file_leaves_the_checksum_alone(make_config, tmp_path,
                                                                                       monkeypatch):
    d = _drafter(tmp_path, None)
    before = drafter_checksum(d)
    (d / PROVENANCE).write_text(json.dumps({"data": {"sampling": {"temperature": 0.0}}}))
    assert drafter_checksum(d) == before
    cfg = make_config({"bench": {"drafter": str(d)}}, check_files=False)
    assert _note(monkeypatch, cfg, bench.resolve_drafter(cfg)) is None
