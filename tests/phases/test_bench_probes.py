"""The prompt subsets each speculative server also measures (the serve-parity sample of training
prompts, each category of the benchmark prompts) were vLLM-only while SGLang's acceptance was its
since-start average. Its windows are now deltas of its own /metrics counters (measured on the H200,
bench/RESULTS.md), so SGLang gets the same probes and the serve-parity gate applies to it too."""

from __future__ import annotations

import json
import sys

import pytest

from eagle3.bench.paths import BenchPaths
from eagle3.phases import bench

PROMPTS = {"ids": ["h1", "h2", "h3"], "texts": ["what is x?", "fix this code", "what is y?"],
           "categories": ["qa", "code", "qa"]}
TRAINED = {"trained": True, "val_full_acc": [0.9, 0.8, 0.7], "train_manifest": "train/manifest.json"}


def _config(make_config, engine: str, **bench_section):
    return make_config({"bench": {"engine": engine, **bench_section}, "engines": {"sglang": {"python": sys.executable}}},
                       check_files=False)


def _probes(cfg, drafter: dict) -> list[dict]:
    paths = BenchPaths.of(cfg)
    paths.dir.mkdir(parents=True)
    return bench._probes(cfg, drafter, PROMPTS, paths)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_every_engine_measures_the_parity_sample_and_each_category(make_config, engine):
    probes = {p["name"]: p for p in _probes(_config(make_config, engine, parity={"prompts": 4}), TRAINED)}
    assert set(probes) == {"training prompts (parity)", "qa", "code"}, probes
    parity = probes["training prompts (parity)"]
    assert parity["kind"] == "parity" and parity["count"] == 4 == len(set(parity["ids"]))
    assert probes["qa"]["ids"] == ["h1", "h3"] and probes["code"]["count"] == 1
    # Each subset is written in the engine's own load-generator format.
    qa = probes["qa"]["dataset"].read_text()
    if engine == "sglang":
        rows = json.loads(qa)
        assert [r["conversations"][0]["value"] for r in rows] == ["what is x?", "what is y?"]
    else:
        assert [json.loads(line)["prompt"] for line in qa.splitlines()] == ["what is x?", "what is y?"]


def test_a_drafter_whose_record_names_its_validation_samples_is_served_their_prompts(make_config, tmp_path):
    rows = "".join(json.dumps({"id": f"p{i}", "prompt": f"q{i}"}) + "\n" for i in range(20))
    (tmp_path / "p.jsonl").write_text(rows)
    cfg = make_config({"datagen": {"prompts": str(tmp_path / "p.jsonl"), "max_samples": 20},
                       "bench": {"parity": {"prompts": 2}}}, check_files=False)
    drafter = {**TRAINED, "data": {"validation_ids": ["p18", "p19"]}}
    probes = {p["name"]: p for p in _probes(cfg, drafter)}
    assert probes["validation prompts (parity)"]["ids"] == ["p18", "p19"]
    assert "training prompts (parity)" not in probes


def test_an_untrained_drafter_gets_no_parity_sample(make_config):
    probes = _probes(_config(make_config, "sglang"), {**TRAINED, "trained": False})
    assert [p["kind"] for p in probes] == ["category", "category"]


@pytest.mark.parametrize("served, status", [(2.9, "passed"), (1.0, "failed")])
def test_the_parity_gate_judges_an_sglang_window_without_per_position_counts(make_config, served, status):
    """SGLang counts no acceptance per position: the gate compares the acceptance length alone."""
    cfg = _config(make_config, "sglang")
    window = {"acceptance": {"acceptance_length": served, "per_position": []}}
    run = {"k": 3, "probes": [{"kind": "parity", "count": 4, "ids": ["a", "b", "c", "d"], "window": window}]}
    gate = bench._parity(cfg, TRAINED, [run])
    assert gate["status"] == status, gate
    assert gate["by_k"]["3"]["measured_acceptance_length"] == served
    assert gate["by_k"]["3"]["measured_per_position"] == []
