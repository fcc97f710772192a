"""A benchmark server's CUDA graphs: captured for exactly the token counts its steps can have
(eagle3/bench/starts.py: graph_sizes; eagle3/engines/vllm.py: with_graph_sizes). vLLM rounds its own
capture sizes up to multiples of k + 1 for full decode graphs, so with its default list a k=2 server at 4
requests (12 tokens) had none. vLLM's CPU build captures no graphs: that every bench server starts with
these flags is the real-server tests' (tests/phases/test_bench.py); what they buy is a GPU's to show."""

from __future__ import annotations

import json

import pytest

from eagle3.bench.starts import graph_sizes
from eagle3.engines.vllm import ENGINE as VLLM
from eagle3.engines.sglang import ENGINE as SGLANG

CC = "--compilation-config"


def vllm_full_decode_sizes(capture: list[int], k: int, max_tokens: int = 32) -> set[int]:
    """The token counts vLLM 0.25's model runner (V2) gives a full decode graph: each capture size rounded
    up to a multiple of k + 1 (vllm/v1/worker/gpu/cudagraph_utils.py, _init_candidates)."""
    q = k + 1
    return {-(-n // q) * q for n in capture if -(-n // q) * q <= max_tokens}


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("concurrency", [[1], [1, 4], [1, 4, 16]])
def test_every_batch_of_a_verify_step_gets_a_full_graph(k, concurrency):
    sizes = graph_sizes(k, concurrency)
    steps = {r * (k + 1) for r in range(1, max(concurrency) + 1)}  # 1 to max(c) requests, k + 1 tokens each
    assert steps <= vllm_full_decode_sizes(sizes, k, max(sizes))
    assert set(range(1, max(concurrency) + 1)) <= set(sizes)  # the baseline's and a drafter's steps: 1 token each
    assert max(sizes) == max(concurrency) * (k + 1)  # nothing larger is captured


def test_vllms_default_list_left_k2_at_concurrency_4_without_one():
    default = [1, 2, 4, 8, 16, 24, 32]  # what the 2026-12-04 H200 servers captured (max_cudagraph_capture_size 32)
    assert 12 not in vllm_full_decode_sizes(default, 2)  # the k=2, c=4 cliff of bench/RESULTS.md
    assert 16 in vllm_full_decode_sizes(default, 3) and 3 in vllm_full_decode_sizes(default, 2)


def test_the_sizes_go_into_the_users_compilation_config_or_a_new_one():
    sizes = graph_sizes(2, [1, 4])
    merged = VLLM.with_graph_sizes(["--gpu-memory-utilization", "0.25", CC, '{"max_cudagraph_capture_size": 32, '
                                    '"mode": 3}'], sizes)
    assert merged[:3] == ["--gpu-memory-utilization", "0.25", CC]
    # the user's other keys stay; their maximum goes (vLLM refuses one that is not the list's largest)
    assert json.loads(merged[3]) == {"mode": 3, "cudagraph_capture_sizes": sizes}
    assert json.loads(VLLM.with_graph_sizes([f"{CC}={{}}"], sizes)[0].split("=", 1)[1]) == {
        "cudagraph_capture_sizes": sizes}
    assert VLLM.with_graph_sizes(["--enforce-eager"], sizes) == ["--enforce-eager", CC,
                                                                 json.dumps({"cudagraph_capture_sizes": sizes})]


@pytest.mark.parametrize("args", [
    [CC, '{"cudagraph_capture_sizes": [1, 8]}'],  # the user's own list
    ["-cc.max_cudagraph_capture_size=8"],  # a dotted key vLLM would not merge with a JSON value
    [f"{CC}.cudagraph_mode", "PIECEWISE"],
    ["-cc", "3"],  # not a JSON object
    [CC],  # no value: vLLM's own error, not ours
])
def test_a_users_own_graph_choice_is_left_as_it_is(args):
    assert VLLM.with_graph_sizes(args, [1, 2, 3]) == args


def test_an_engine_without_such_a_list_is_left_alone():
    assert SGLANG.with_graph_sizes(["--mem-fraction-static", "0.2"], [1, 2]) == ["--mem-fraction-static", "0.2"]
