"""Issue 22: with `bench.drafter` set, the report said "the training data was generated at temperature
0.6": this config's datagen value, not what that drafter learned from. The note now comes from the
drafter's own provenance (the train manifest, or the eagle3-provenance.json the train phase writes beside
the checkpoint it serves), and says nothing where none is recorded."""

from __future__ import annotations

import json

from eagle3.bench.provenance import drafter_checksum
from eagle3.drafters.formats import PROVENANCE
from eagle3.phases import bench
from tests.conftest import _merge, write_tiny_config


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


def _moved(tmp_path, name: str, overrides: dict | None = None):
    """The tiny config as if from a checkout at tmp_path/name: every path it holds lies elsewhere."""
    home = tmp_path / name
    (home / "model").mkdir(parents=True)
    base = {"target": {"model": str(home / "model")}, "bench": {"drafter": str(_drafter(home, None))},
            "engines": {"vllm": {"env": {"PYTHONPATH": f"{home}/site:{home}/pack", "HF_HOME": str(home / "hf")}}}}
    _merge(base, overrides or {})
    return write_tiny_config(home, base, check_files=False)


def test_a_checkout_moved_elsewhere_asks_the_engine_the_same_and_a_changed_flag_does_not(tmp_path):
    """The watch compares what the benchmark asks of its engine across reruns (issue 54): paths and the
    servers' ports are where things lie, not what is asked; a flag, a variable or the dtype is."""
    from eagle3.bench.provenance import serving_fingerprint

    here, there = _moved(tmp_path, "here"), _moved(tmp_path, "there")
    assert here.fingerprint() != there.fingerprint(), "the whole config's hash holds the paths"
    assert here.bench.server.port != there.bench.server.port
    assert serving_fingerprint(here) == serving_fingerprint(there)
    for change in ({"bench": {"server": {"extra_args": ["--max-num-seqs", "8"]}}},
                   {"engines": {"vllm": {"env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}}},
                   {"target": {"dtype": "bfloat16"}}):
        other = _moved(tmp_path, f"changed-{sorted(change)[0]}", change)
        assert serving_fingerprint(other) != serving_fingerprint(here), change
