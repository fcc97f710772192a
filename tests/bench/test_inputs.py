"""F7 before any server: the benchmark gates the drafter it will serve for bench.engine first. On the
H200 (2026-12-02, bench/results/sglang-h200-20261202/) `eagle3 bench` with SGLang and a speculators
checkpoint started its baseline server before anything looked at the drafter; real SGLang 0.5.16 then
refuses that checkpoint's config at load, and serves an exported one with its input norm dropped
(unmatched tensor names are skipped without a word). Here the engine is the SGLang stand-in: were the
gate missing, its server would start (a registry entry, a server log)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eagle3.doctor import FAIL, PASS, check_drafter
from eagle3.drafters.export import export_drafter
from eagle3.errors import GateError
from eagle3.phases.bench import run_bench
from eagle3.phase_runner import supervisor

from tests.conftest import REPO
from tests.ports import free_port

FIXTURE = REPO / "tests" / "fixtures" / "eagle3-tiny"
FAKE_SGLANG = REPO / "tests" / "engines" / "fake_sglang"


def _config(make_config, drafter: Path, engine: str = "sglang"):
    return make_config({
        "target": {"model": str(FIXTURE / "target")},
        "engines": {"sglang": {"python": sys.executable, "env": {"PYTHONPATH": str(FAKE_SGLANG)}}},
        "bench": {"engine": engine, "drafter": str(drafter), "server": {"port": free_port(), "extra_args": []},
                  "num_speculative_tokens": [3], "concurrency": [1], "num_prompts": 2, "max_tokens": 8}})


def _refused(cfg) -> str:
    sup = supervisor(cfg)
    with pytest.raises(GateError) as err:
        run_bench(cfg, sup)
    assert sup.registry.entries() == []
    assert not list(cfg.phase_dir("bench").rglob("*server*.log")), "a server was started before the gate"
    return str(err.value)


def test_a_speculators_checkpoint_for_sglang_is_refused_before_any_server(make_config):
    text = _refused(_config(make_config, FIXTURE / "drafter-trained"))
    assert text.startswith(f"bench.drafter: {FIXTURE / 'drafter-trained'} is not loadable as trained by sglang")
    assert "no server was started" in text and "eagle3 export-drafter" in text


def test_an_export_whose_norms_sglang_drops_is_refused_too(make_config, tmp_path):
    exported = tmp_path / "exported"
    export_drafter(FIXTURE / "drafter-trained", exported, "sglang")  # writes it, and its gate report says FAIL
    text = _refused(_config(make_config, exported))
    assert "input_norm.weight" in text and "drops it silently" in text and "--no-norm-before-fc" in text


def test_the_doctor_gates_bench_drafter_for_the_bench_engine(make_config):
    cfg = _config(make_config, FIXTURE / "drafter-trained")
    check = check_drafter(cfg)
    assert check.status == FAIL and check.reason.startswith(f"bench.drafter {FIXTURE / 'drafter-trained'}: ")
    vllm = make_config({"target": {"model": str(FIXTURE / "target")},
                        "bench": {"drafter": str(FIXTURE / "drafter-trained")}})
    assert check_drafter(vllm).status == PASS
