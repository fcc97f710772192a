"""The KV cache a benchmark server needs, sized by the pack so that a round's servers can start side by side.

vLLM sizes its KV cache by profiling a forward pass at start, and counts the memory any other process
allocates meanwhile as its own (docs/FACTS.md §13): two servers starting at once on one GPU would each
shrink the other's cache, or fail. Given the size (`--kv-cache-memory-bytes`) it skips that profiling.
The size here holds the round's largest concurrency of the longest request the benchmark sends, and
never less than one request of target.max_model_len, below which vLLM refuses to start. It is rounded
up to a power of two tokens, so that reruns on other prompts of about the same length keep the flag's
value, and with it the compile cache's key.
"""

from __future__ import annotations

import math

from ..prompts import tokens_at_most

BLOCK_TOKENS = 16  # vLLM's default block size: each sequence's last block may be mostly empty
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def _attention(config: dict) -> dict:
    """The part of a config.json that describes the decoder layers: a multimodal model's text_config,
    a speculators drafter's transformer_layer_config, or the config itself."""
    for key in ("text_config", "transformer_layer_config"):
        if isinstance(config.get(key), dict):
            return config[key]
    return config


def _positive_int(d: dict, key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def elements_per_token(config: dict) -> int | None:
    """KV cache elements one token costs over every layer of `config`; None for an attention shape
    this does not know (no layer count or head sizes), where the pack cannot size the cache."""
    text = _attention(config)
    layers = _positive_int(text, "num_hidden_layers")
    if layers is None:
        return None
    if "kv_lora_rank" in text:  # multi-head latent attention (DeepSeek): one compressed latent per token
        rank, rope = _positive_int(text, "kv_lora_rank"), _positive_int(text, "qk_rope_head_dim")
        return layers * (rank + rope) if rank and rope else None
    heads = _positive_int(text, "num_attention_heads")
    kv_heads = _positive_int(text, "num_key_value_heads") or heads
    hidden = _positive_int(text, "hidden_size")
    head_dim = _positive_int(text, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (kv_heads and head_dim):
        return None
    return layers * 2 * kv_heads * head_dim  # a key and a value per KV head


def dtype_bytes(dtype: str, config: dict) -> int:
    """Bytes per KV element: the served dtype, or with "auto" the one config.json names (4 if unknown)."""
    if dtype == "auto":
        text = _attention(config)
        dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "float32")
    return DTYPE_BYTES.get(dtype, 4)


def kv_cache_bytes(target: dict, dtype: str, drafter: dict | None, max_model_len: int, concurrency: int,
                   longest_prompt_bytes: int, max_tokens: int, k: int) -> int | None:
    """The KV cache, in bytes, of a benchmark server (a drafter's layers share it; k speculative tokens
    are looked ahead per sequence); None where an attention shape is unknown. The longest request is
    bounded by its prompt's bytes (prompts.tokens_at_most)."""
    per_token = elements_per_token(target)
    extra = elements_per_token(drafter) if drafter is not None else 0
    if per_token is None or extra is None:
        return None
    sequence = tokens_at_most(longest_prompt_bytes, max_tokens, max_model_len) + k + 1 + BLOCK_TOKENS
    tokens = max(max_model_len + BLOCK_TOKENS, concurrency * sequence)
    tokens = 1 << math.ceil(math.log2(tokens))
    return tokens * (per_token + extra) * dtype_bytes(dtype, target)
