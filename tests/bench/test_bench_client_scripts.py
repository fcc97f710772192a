"""The bench/ scripts that measure a client against the session's shared vLLM CPU server, in smoke
mode. Apart from tests/bench/test_bench_scripts.py, whose smokes start servers of their own: a module
that uses the shared server runs on the worker that holds it (tests/xdist_plan.py), and those smokes
are free to run on the other."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.bench.test_bench_scripts import _script
from tests.conftest import REPO

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow, pytest.mark.engine]


def _client_bench(name: str, vllm_server, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    """A client benchmark in smoke mode against the session's shared server: its run and its --json."""
    out = tmp_path / f"{name}.json"
    res = _script(name, "--smoke", "--base-url", vllm_server.base_url, "--json", str(out),
                  env={**os.environ, "OPENAI_API_KEY": vllm_server.key})
    return res, json.loads(out.read_text())


def test_datagen_client_vs_vllm_bench_smoke(vllm_server, tmp_path):
    res, data = _client_bench("datagen_vs_vllm_bench.py", vllm_server, tmp_path)
    [row] = data["rounds"]
    # the same work on both sides: 8 prompts x 16 tokens (greedy, ignore_eos)
    assert row["ours"]["tokens"] == row["vllm_bench"]["tokens"] == 8 * 16
    assert row["ours"]["output_tok_s"] > 0 and row["vllm_bench"]["output_tok_s"] > 0 and data["ratio"] > 0
    assert "ratio" in res.stdout and "recorded in" not in res.stdout  # smoke mode records nothing


def test_datagen_client_split_smoke(vllm_server, tmp_path):
    _, data = _client_bench("datagen_client_split.py", vllm_server, tmp_path)
    [row] = data["rounds"]
    # every variant did the same work: 8 prompts x 16 tokens (greedy, ignore_eos)
    assert {kind: r["tokens"] for kind, r in row.items()} == {kind: 8 * 16 for kind in row} and len(row) == 5


def test_idle_ttft_probe_measures_each_gap_alone_and_after_the_neighbour(vllm_server):
    """The probe's measurement against the session's shared server, which here plays the neighbour too
    (main starts its own servers as bench/alternation_probe.py does): every planned request is timed
    once, the neighbour's are not counted, and the summary keeps gap and neighbour apart."""
    import asyncio

    sys.path.insert(0, str(REPO / "bench"))
    import idle_ttft_probe as probe

    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0.0, "ignore_eos": True}
    plan = [(0.0, False), (0.2, True), (0.0, True), (0.2, False), (0.2, False)]
    rows = asyncio.run(probe.measure(vllm_server.base_url, vllm_server.key, [body], plan, vllm_server.base_url))
    assert [(r["gap_s"], r["after_neighbour"]) for r in rows] == plan
    assert all(r["output_tokens"] == 4 and 0 < r["ttft_ms"] <= r["latency_ms"] for r in rows)
    summary = probe.by_gap(rows)
    assert [(s["gap_s"], s["after_neighbour"], s["n"]) for s in summary] == [
        (0.0, False, 1), (0.0, True, 1), (0.2, False, 2), (0.2, True, 1)]
