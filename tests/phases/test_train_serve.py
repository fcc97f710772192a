"""Phase 3 on CPU, end to end with real parts: a phase-2 output made by the real pipeline (vLLM CPU
server, speculators prepare-data and generate-offline-data), the phase's `speculators train
--dry-run` checkpoint marked UNTRAINED, the vLLM gate, and a real vLLM CPU server that loads it as
its EAGLE-3 drafter and answers. The same target with the drafter trained on an H200 by
tests/gpu/test_train_gpu.py (tests/fixtures/eagle3-tiny) is measured the same way: trained
acceptance must be far above the untrained one's.

Three vLLM servers start here (about 1 min each on 2 cores): the trained-drafter server also
serves phase 1's requests, so no separate data-generation server is needed.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest

from eagle3.drafters.formats import PROVENANCE
from eagle3.drafters.loadable import check_drafter
from eagle3.engines.metrics import acceptance
from eagle3.engines.vllm import read_counters
from eagle3.engines.serving import base_url, start_server
from eagle3.phases.datagen import run_datagen
from eagle3.phases.extract import run_extract
from eagle3.phases.train import TrainPaths, read_train_manifest, run_train
from eagle3.prompts import load_prompts
from eagle3.process.services import Supervisor, state_dir_for
from tests.conftest import requires_engine, write_tiny_config
from tests.ports import free_port

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "eagle3-tiny"
# Rows 12-19 of the prompt set: beyond the 12 this test's phase 1 uses, but among the 64 the fixture
# drafter was trained on. So these are *training* prompts of the trained drafter (its held-out
# acceptance is measured by the bench phase: tests/fixtures/bench-history/, phases/test_bench_parity.py).
PROBE_PROMPTS = 8

pytestmark = [pytest.mark.slow, pytest.mark.engine, requires_engine]


def _spec_args(drafter: Path) -> list[str]:
    return ["--speculative-config",
            json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3})]


# The servers this test starts are asked with this key, as a user's clients would (configured, so the
# datagen phase can use the bench server as an external one, --base-url style).
KEY = f"sk-eagle3-train-serve-{uuid.uuid4().hex}"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def _measure(cfg, url: str) -> tuple[float, list[str]]:
    """Greedy chat completions of the probe prompts (rows 12-19, training prompts of the fixture
    drafter); acceptance length from /metrics deltas."""
    prompts = load_prompts(cfg.datagen.prompts).prompts
    probe = prompts[cfg.datagen.max_samples: cfg.datagen.max_samples + PROBE_PROMPTS]
    before = read_counters(url)[0]
    texts = []
    for p in probe:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, headers=HEADERS, json={
            "model": cfg.target.served_name, "messages": list(p.messages), "max_tokens": 32, "temperature": 0.0})
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["message"]["content"])
    acc = acceptance(read_counters(url)[0] - before)
    assert acc.drafts > 0, "the server never drafted: the drafter was not used"
    return acc.acceptance_length, texts


def test_cpu_rehearsal_dry_run_serves_and_trained_fixture_beats_it(tmp_path):
    port = free_port()
    cfg = write_tiny_config(tmp_path, {
        "target": {"model": str(FIXTURE / "target")},
        "datagen": {"max_samples": 12, "concurrency": 4, "sampling": {"max_tokens": 32},
                    "server": {"port": free_port(), "api_key": KEY}},
        "extract": {"server": {"port": free_port()}, "seq_length": 256},
        "bench": {"server": {"port": port, "api_key": KEY}},
        "train": {"draft_vocab_size": 2048},
    })
    sup = Supervisor(state_dir_for(cfg.run_dir))
    url = base_url(cfg.bench.server)
    trained = FIXTURE / "drafter-trained"
    assert check_drafter(trained, "vllm", target=FIXTURE / "target", expected_aux_ids=[2, 4, 5]).ok

    # The target with the H200-trained drafter: measure it, and let it serve phase 1's requests.
    server = start_server(sup, cfg, "bench", "vllm", cfg.bench.server, extra_args=_spec_args(trained))
    try:
        trained_len, trained_texts = _measure(cfg, url)
        summary = run_datagen(cfg, None, base_url=url)
        assert summary.details["samples"] == cfg.datagen.max_samples
    finally:
        server.stop()

    # Phase 2 for real, then phase 3 without an accelerator: a dry run, marked UNTRAINED.
    run_extract(cfg, sup)
    manifest = run_train(cfg, sup).details
    assert manifest == read_train_manifest(cfg)
    assert manifest["trained"] is False and manifest["status"].startswith("UNTRAINED")
    assert manifest["checkpoint"] == str(TrainPaths.of(cfg).dry_run)
    assert manifest["aux_layer_ids"] == [2, 4, 5] and manifest["aux_layer_ids_convention"] == "vllm"
    assert manifest["engine"] == "vllm" and manifest["gate"]["ok"] and manifest["draft_vocab_size"] == 2048
    assert "--dry-run" in (TrainPaths.of(cfg).log).read_text()
    # The record beside the checkpoint travels with it (bench.drafter elsewhere): a dry run measured nothing.
    record = json.loads((Path(manifest["checkpoint"]) / PROVENANCE).read_text())
    assert record["trained"] is False and record["training"]["val_full_acc"] is None
    assert record["training"]["aux_layer_ids_vllm"] == [2, 4, 5] and record["data"]["samples"] == manifest["data"]["samples"]
    # Each prepared row traced back to its sample through the prompt ids vLLM reported in phase 1; the
    # trainer's validation rows (the last tenth, in prepare-data's shuffled order) named by sample id.
    generated = [json.loads(line)["id"] for line in cfg.layout.samples.read_text().splitlines()]
    rows = json.loads(cfg.layout.prepared_index.read_text())["sample_ids"]
    assert sorted(rows) == sorted(generated) and rows != generated  # every row found; shuffled
    assert record["data"]["validation_ids"] == manifest["data"]["validation_ids"] == rows[10:]
    report = check_drafter(manifest["checkpoint"], "vllm", target=cfg.target.model, expected_aux_ids=[2, 4, 5])
    assert report.ok, report.render()

    # vLLM loads the untrained checkpoint as its EAGLE-3 drafter and answers.
    server = start_server(sup, cfg, "bench", "vllm", cfg.bench.server,
                          extra_args=_spec_args(Path(manifest["checkpoint"])))
    try:
        r = httpx.post(f"{url}/v1/completions", timeout=120, headers=HEADERS, json={
            "model": cfg.target.served_name, "prompt": "Explain a hash map", "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
        untrained_len, untrained_texts = _measure(cfg, url)
    finally:
        server.stop()
    assert not sup.registry.entries()

    # Same target, same greedy prompts: speculative decoding must not change the text, and the
    # trained drafter must be accepted far more often than the untrained one.
    assert trained_texts == untrained_texts
    print(f"mean acceptance length (k=3, 32 greedy tokens, prompt rows 12-19 = training prompts of the fixture): "
          f"trained {trained_len:.2f}, untrained {untrained_len:.2f}")
    assert untrained_len < 1.5
    assert trained_len > untrained_len + 1.0
