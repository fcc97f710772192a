"""Can one vLLM server do data generation and then extraction, loading the target once instead of
twice (issue 39)? The target is started twice on the same config: plain, as the datagen phase starts
it, and with the extract phase's flags (the extract_hidden_states speculative method and the
hidden-states connector). Both get the same greedy chat requests, the datagen phase's own payloads.
Recorded: whether their texts and token ids are equal, each server's output tok/s, and which
hidden-state files the extraction server wrote for those generation requests (how many, of how many
tokens each, against the prompt's and the answer's token counts).

    .venv/bin/python bench/one_server_probe.py [--num-prompts 16] [--max-tokens 32] [--json FILE]
    .venv/bin/python bench/one_server_probe.py --smoke      # 2 prompts of 8 tokens, not a measurement
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.engines import hidden_states  # noqa: E402
from eagle3.engines.probe import engine_accepts  # noqa: E402
from eagle3.engines.serving import api_key, base_url, start_server  # noqa: E402
from eagle3.openai_client import OpenAIClient  # noqa: E402
from eagle3.phases.datagen import build_payload  # noqa: E402
from eagle3.phases.extract_manifest import resolve_layer_plan  # noqa: E402
from eagle3.process.services import Supervisor  # noqa: E402
from eagle3.prompts import load_prompts  # noqa: E402
from eagle3.safetensors_header import read_header  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402


async def _generate(url: str, key: str, bodies: list[dict]) -> list:
    async with OpenAIClient(url, api_key=key, max_connections=4) as client:
        sem = asyncio.Semaphore(4)

        async def one(body: dict):
            async with sem:
                return await client.chat(body)

        return await asyncio.gather(*(one(b) for b in bodies))


def _readable(files: list[Path]) -> list[dict]:
    shapes = []
    for f in files:
        try:
            shapes.append({k: t.shape for k, t in read_header(f).tensors.items()})
        except Exception as e:  # noqa: BLE001 - what the connector left is what is reported
            shapes.append({"unreadable": f"{type(e).__name__}: {e}"})
    return shapes


def _settled(staging: Path, n: int, timeout_s: float = 30.0) -> None:
    """Wait (bounded) until the connector has written a readable file per request: it writes after the
    response has gone back, and a server stopped at once left one file half-written (a CI smoke failure)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shapes = _readable(sorted(p for p in staging.rglob("*") if p.is_file()))
        if len(shapes) >= n and all("unreadable" not in s for s in shapes):
            return
        time.sleep(0.2)


def serve_and_ask(cfg, sup, phase: str, server, bodies: list[dict], extra: list[str] = (), env: dict | None = None,
                  staging: Path | None = None):
    proc = start_server(sup, cfg, phase, "vllm", server, extra_args=list(extra), env=env)
    try:
        t0 = time.monotonic()
        results = asyncio.run(_generate(base_url(server), api_key(cfg, server, f"{phase}.server"), bodies))
        seconds = time.monotonic() - t0
        if staging is not None:
            _settled(staging, len(bodies))
    finally:
        proc.stop()
    tokens = sum(r.completion_tokens for r in results)
    return results, {"seconds": round(seconds, 3), "output_tokens": tokens, "output_tok_s": round(tokens / seconds, 1)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    n, m = (2, 8) if args.smoke else (args.num_prompts, args.max_tokens)
    with tempfile.TemporaryDirectory(prefix="eagle3-one-server-") as tmp:
        cfg = write_tiny_config(Path(tmp), {"datagen": {"sampling": {"temperature": 0.0, "max_tokens": m, "seed": 0}}})
        sup = Supervisor(cfg.layout.state)
        prompts = load_prompts(cfg.datagen.prompts, n).prompts
        bodies = [build_payload(cfg, p) for p in prompts]
        plain, plain_stats = serve_and_ask(cfg, sup, "datagen", cfg.datagen.server, bodies)
        staging = Path(tmp) / "staging"
        staging.mkdir()
        layers = list(resolve_layer_plan(cfg).layer_ids)
        flags = hidden_states.server_args(layers, staging, cpu=cfg.cpu_rehearsal,
                                          scale_out_flag=engine_accepts(cfg, sup, "vllm", "--enable-scale-out"))
        extracting, extract_stats = serve_and_ask(cfg, sup, "extract", cfg.extract.server, bodies, flags,
                                                  hidden_states.server_env(cfg.cpu_rehearsal, cfg.engines.vllm.env),
                                                  staging=staging)
        files = sorted(p for p in staging.rglob("*") if p.is_file())
        shapes = _readable(files)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": f"{os.uname().nodename} {os.cpu_count()} CPUs",
        "target": str(cfg.target.model), "prompts": n, "max_tokens": m, "layer_ids": layers,
        "plain": plain_stats, "extraction_server": extract_stats,
        "texts_equal": sum(a.content == b.content for a, b in zip(plain, extracting)),
        "token_ids_equal": sum(a.token_ids == b.token_ids for a, b in zip(plain, extracting)),
        "prompt_tokens": [r.prompt_tokens for r in plain], "answer_tokens": [r.completion_tokens for r in plain],
        "files_written": len(files), "file_tensor_shapes": shapes,
    }
    if args.smoke:
        result["smoke"] = "2 prompts of 8 tokens: not a measurement"
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
