"""The KV cache the pack gives a benchmark server that starts beside others (eagle3/bench/kv_budget.py).
That vLLM takes this size and counts the same tokens in it is tests/phases/test_bench.py's, on real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.bench.kv_budget import dtype_bytes, elements_per_token, kv_cache_bytes
from eagle3.prompts import TEMPLATE_TOKENS

REPO = Path(__file__).resolve().parents[2]
# SmolLM2-135M-Instruct's attention, as `eagle3 make-model smollm2` writes it (the GPU profile's target).
SMOLLM2 = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
           "hidden_size": 576, "torch_dtype": "bfloat16"}


def test_a_token_costs_a_key_and_a_value_per_kv_head_in_every_layer():
    assert elements_per_token(SMOLLM2) == 30 * 2 * 3 * 64
    no_head_dim = {k: v for k, v in SMOLLM2.items() if k != "head_dim"}
    assert elements_per_token(no_head_dim) == 30 * 2 * 3 * (576 // 9)  # hidden / heads
    no_kv_heads = {k: v for k, v in SMOLLM2.items() if k != "num_key_value_heads"}
    assert elements_per_token(no_kv_heads) == 30 * 2 * 9 * 64  # multi-head attention: every head keeps K and V


def test_nested_configs_and_latent_attention():
    assert elements_per_token({"text_config": SMOLLM2}) == elements_per_token(SMOLLM2)
    drafter = {"transformer_layer_config": {**SMOLLM2, "num_hidden_layers": 1}}  # speculators' layout
    assert elements_per_token(drafter) == 2 * 3 * 64
    mla = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128, "head_dim": 192,
           "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert elements_per_token(mla) == 61 * (512 + 64)  # one latent per token, not a K and V per head


@pytest.mark.parametrize("config", [{}, {"num_hidden_layers": 4}, {"num_hidden_layers": 4, "num_attention_heads": 0},
                                    {"num_hidden_layers": True, "num_attention_heads": 4, "head_dim": 8},
                                    {"num_hidden_layers": 4, "kv_lora_rank": 512}])
def test_an_attention_shape_it_does_not_know_gives_no_size(config):
    assert elements_per_token(config) is None
    assert kv_cache_bytes(config, "bfloat16", None, 2048, 4, 300, 128, 0) is None


def test_the_dtype_served_or_the_configs_own():
    assert dtype_bytes("bfloat16", {}) == 2 and dtype_bytes("float32", {}) == 4
    assert dtype_bytes("auto", SMOLLM2) == 2 and dtype_bytes("auto", {"dtype": "float16"}) == 2
    assert dtype_bytes("auto", {}) == 4  # unknown: the larger


def test_the_size_holds_the_largest_concurrency_of_the_longest_request():
    per_token = 30 * 2 * 3 * 64 * 2
    # 4 sequences of 300 prompt bytes + the template + 128 answer tokens (+ k + 1 + a block): 4 x 701 = 2804,
    # rounded up to 4096 tokens.
    assert kv_cache_bytes(SMOLLM2, "bfloat16", None, 2048, 4, 300, 128, 0) == 4096 * per_token
    # A drafter's layer shares the cache: its elements are added per token.
    drafter = {**SMOLLM2, "num_hidden_layers": 1}
    assert kv_cache_bytes(SMOLLM2, "bfloat16", drafter, 2048, 4, 300, 128, 3) == 4096 * (per_token + 2 * 3 * 64 * 2)
    # Never below one request of max_model_len (vLLM refuses to start below it): one short sequence still
    # gets 2048 + a block, rounded up.
    assert kv_cache_bytes(SMOLLM2, "bfloat16", None, 2048, 1, 10, 16, 0) == 4096 * per_token
    # A request is at most max_model_len long, whatever the prompt's bytes.
    assert kv_cache_bytes(SMOLLM2, "bfloat16", None, 2048, 2, 10**6, 128, 0) == 8192 * per_token


def test_prompts_of_about_the_same_length_keep_the_same_size():
    sizes = {kv_cache_bytes(SMOLLM2, "bfloat16", None, 2048, 4, n, 128, 3) for n in range(200, 400, 7)}
    assert len(sizes) == 1  # the flag's value, and with it the compile cache's key, stays put across reruns
    assert TEMPLATE_TOKENS >= 128


def test_the_real_target_config_when_it_is_here():
    path = REPO / "models" / "smollm2-135m" / "config.json"
    if not path.is_file():
        pytest.skip("models/smollm2-135m is made by `make demo` (eagle3 make-model smollm2)")
    assert elements_per_token(json.loads(path.read_text())) == elements_per_token(SMOLLM2)
