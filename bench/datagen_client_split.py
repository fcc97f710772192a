"""Where the data-generation client loses to `vllm bench serve`: the same server and work, split into
client and request. Each round runs, in a rotating order:

  ours          the phase itself (`run_datagen`: its client, payload, rows, fsyncs, progress)
  vllm-bench    `vllm bench serve` (aiohttp, streaming), as bench/datagen_vs_vllm_bench.py runs it
  bare-ours     a bare httpx loop sending the phase's own payloads (no rows, no phase): the client alone
  bare-stream   the same bare loop sending vLLM bench's request (stream: true, no token ids, no seed)
  bare-plain    the bare loop, the phase's payload without return_token_ids and seed

and prints each variant's output tok/s pooled over the rounds, with its per-round spread and its ratio
to vllm-bench; --json keeps every round.

    .venv/bin/python bench/datagen_client_split.py [--rounds 4] [--num-prompts 128] [--concurrency 8]
        [--max-tokens 64] [--base-url URL] [--json FILE] [--smoke]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from datagen_vs_vllm_bench import free_port, machine, run_ours, run_vllm, variant, work_args  # noqa: E402

from eagle3.config import load_config  # noqa: E402
from eagle3.engines.serving import api_key, base_url, start_server  # noqa: E402
from eagle3.phases.datagen import build_payload  # noqa: E402
from eagle3.process.services import Supervisor  # noqa: E402
from eagle3.prompts import load_prompts  # noqa: E402

VARIANTS = ("ours", "vllm-bench", "bare-ours", "bare-stream", "bare-plain")


def payloads(cfg, prompts, kind: str) -> list[dict]:
    out = []
    for p in prompts:
        body = build_payload(cfg, p)
        if kind in ("bare-stream", "bare-plain"):
            body.pop("return_token_ids", None)
            body.pop("seed", None)
        if kind == "bare-stream":
            body.update(stream=True, stream_options={"include_usage": True})
        out.append(body)
    return out


async def bare(url: str, key: str | None, bodies: list[dict], concurrency: int) -> dict:
    """A loop of `concurrency` workers over one httpx client: nothing but the requests."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    tokens = 0
    queue = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=300) as http:
        async def worker():
            nonlocal tokens
            for body in queue:
                if body.get("stream"):
                    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
                        r.raise_for_status()
                        async for line in r.aiter_lines():
                            if line.startswith("data: {") and '"usage"' in line:
                                usage = json.loads(line[6:]).get("usage") or {}
                                tokens += usage.get("completion_tokens") or 0
                else:
                    r = await http.post("/v1/chat/completions", json=body)
                    r.raise_for_status()
                    tokens += r.json()["usage"]["completion_tokens"]

        cpu0, t0 = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.monotonic() - t0
    return {"output_tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "client_cpu_s": time.process_time() - cpu0}


def one(kind: str, cfg, sup, url, key, prompts, dataset, work: Path, tag: str, args) -> dict:
    if kind == "ours":
        return run_ours(variant(cfg, work / tag, args.num_prompts, args.concurrency, args.max_tokens, key=key), url)
    if kind == "vllm-bench":
        return run_vllm(cfg, sup, url, dataset, work, tag)
    return asyncio.run(bare(url, key, payloads(cfg, prompts, kind), args.concurrency))


def main() -> int:
    ap = work_args(__doc__, num_prompts=128, rounds=4)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="1 round of 8 prompts of 16 tokens")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.num_prompts, args.max_tokens = 1, 8, 16
    work = Path(tempfile.mkdtemp(prefix="datagen-split-"))
    sup = Supervisor(work / "state")
    cfg = variant(load_config(args.config), work, args.num_prompts, args.concurrency, args.max_tokens, port=free_port())
    prompts = load_prompts(cfg.datagen.prompts, args.num_prompts).prompts
    dataset = work / "custom.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p.messages[0]["content"]}) + "\n" for p in prompts))
    rounds: list[dict] = []
    try:
        if args.base_url:
            url, key = args.base_url, os.environ.get(args.api_key_env)
        else:
            start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
            url, key = base_url(cfg.datagen.server), api_key(cfg, cfg.datagen.server, "datagen.server")
        cfg = variant(cfg, work, args.num_prompts, args.concurrency, args.max_tokens, key=key)
        asyncio.run(bare(url, key, payloads(cfg, prompts[:8], "bare-ours"), args.concurrency))  # warm the server
        for i in range(args.rounds):
            order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]  # rotate: no variant always first
            row = {kind: one(kind, cfg, sup, url, key, prompts, dataset, work, f"{kind}-{i}", args) for kind in order}
            rounds.append(row)
            print(f"round {i + 1}: " + ", ".join(f"{k} {row[k]['output_tok_s']:.0f}" for k in VARIANTS), flush=True)
    finally:
        sup.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    pooled = {k: sum(r[k]["tokens"] for r in rounds) / sum(r[k]["seconds"] for r in rounds) for k in VARIANTS}
    for k in VARIANTS:
        per = [r[k]["output_tok_s"] / r["vllm-bench"]["output_tok_s"] for r in rounds]
        print(f"{k:12s} {pooled[k]:8.1f} tok/s  ratio to vllm-bench {pooled[k] / pooled['vllm-bench']:.3f} "
              f"(per round {min(per):.2f}-{max(per):.2f}, median {statistics.median(per):.2f}); client CPU "
              f"{statistics.median(r[k].get('client_cpu_s', float('nan')) for r in rounds):.2f} s")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "args": {k: v for k, v in vars(args).items()
                                                                         if k != "json"} | {"config": str(args.config)},
                                         "rounds": rounds, "pooled_tok_s": pooled}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
