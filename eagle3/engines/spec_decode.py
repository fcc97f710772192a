"""How each engine is told to speculate with an EAGLE-3 drafter, and how each reports acceptance."""

from __future__ import annotations

import json
from pathlib import Path


def spec_args(engine: str, drafter: Path, k: int) -> list[str]:
    """Server flags for target + drafter with k speculative tokens (a chain: one token per step)."""
    if engine == "vllm":
        # `method` always explicit: without it vLLM guesses from the path and may pick "draft_model".
        return ["--speculative-config",
                json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k})]
    if engine == "sglang":
        # EAGLE3, never EAGLE: EAGLE with an EAGLE-3 drafter runs with accept length 1.00 and no error.
        # All three of steps/topk/draft tokens, as SGLang wants; topk 1 + k+1 draft tokens = a chain of k.
        return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter),
                "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]
    raise ValueError(f"unknown engine {engine!r}")


def acceptance_source(engine: str) -> str:
    return {"vllm": "vllm /metrics spec-decode counter deltas around the window",
            "sglang": "sglang /metrics counter deltas around the window (verify calls, generation tokens, requests; "
                      "no per-position counts)"}[engine]
