"""The vLLM load generator's result files, as each vLLM release the pack meets writes them."""

from __future__ import annotations

import json

import pytest

from eagle3.bench.figures import speed_figures
from eagle3.engines.vllm import parse_result as parse_vllm

# A --save-detailed result of two streamed requests: 0.32 writes "latencies", 0.25 does not (its
# vllm/benchmarks/serve.py saves output_lens, ttfts, itls, start_times, errors only).
COMMON = {"completed": 3, "failed": 0, "total_input_tokens": 30, "total_output_tokens": 12, "duration": 1.0,
          "request_throughput": 3.0, "output_throughput": 12.0, "mean_tpot_ms": 40.0,
          "output_lens": [4, 5, 3], "ttfts": [0.1, 0.2, 0.1], "itls": [[0.05, 0.05], [0.02, 0.03, 0.05], [0.1]],
          "errors": ["", "", ""]}


@pytest.mark.parametrize("release, extra", [("0.32", {"latencies": [0.2, 0.3, 0.2]}), ("0.25", {})])
def test_per_request_data_and_an_interval_from_both_releases(tmp_path, release, extra):
    path = tmp_path / f"result-{release}.json"
    path.write_text(json.dumps({**COMMON, **extra}))
    load = parse_vllm(path)
    assert [r["latency_ms"] for r in load.requests] == [200.0, 300.0, 200.0]
    assert [r["chunks"] for r in load.requests] == [2, 3, 1]
    figures = speed_figures(load.to_dict())
    assert figures["output_tok_s"]["lo"] is not None and figures["output_tok_s"]["hi"] is not None
    assert figures["output_tok_s"]["method"] == "bootstrap over 3 requests"


def test_a_result_without_per_request_data_has_no_interval(tmp_path):
    path = tmp_path / "summary-only.json"
    path.write_text(json.dumps({k: v for k, v in COMMON.items() if k not in ("ttfts", "itls")}))
    load = parse_vllm(path)
    assert load.requests is None
    assert speed_figures(load.to_dict())["output_tok_s"]["method"] == "no per-request data"
