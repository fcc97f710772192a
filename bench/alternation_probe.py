"""Does finer interleaving narrow an A/A interval (issue 37)? Two servers of one config (A and its twin
B) get the same greedy requests, one at a time, two ways in turn:

  - windows:     block after block, W requests to A, then W to B (the benchmark's window slots);
  - alternating: within each block, A and B take turns request by request (A B B A ...), so both
                 see the machine within the same second.

Each block gives one ratio (B's output tok/s over A's), and the interval is the 95 % t-interval of the
blocks' log ratios. Both designs have the same blocks, requests and servers. On the H200 a
window's speed moved 8-16 % in levels that last seconds: run6's per-request TPOT has a lag-1
autocorrelation of 0.67 at concurrency 1. If those levels are the machine's, not one server's,
alternating cancels them and its interval is the narrower one. A/A: both must contain 1.

    .venv/bin/python bench/alternation_probe.py --blocks 10 --per-block 8 --rounds 2 --json FILE
    .venv/bin/python bench/alternation_probe.py --config configs/h200-smollm2.yaml ...   # the GPU profile
    .venv/bin/python bench/alternation_probe.py --smoke     # 2 blocks of 2 requests on one server, not a measurement
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.bench.repeats import t975  # noqa: E402
from eagle3.config import load_config  # noqa: E402
from eagle3.engines.serving import api_key, base_url, start_server  # noqa: E402
from eagle3.fsio import atomic_write_json  # noqa: E402
from eagle3.openai_client import OpenAIClient  # noqa: E402
from eagle3.process.services import Supervisor  # noqa: E402
from eagle3.prompts import load_prompts  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402
from tests.ports import free_port  # noqa: E402

DESIGNS = ("windows", "alternating")


def interval(ratios: list[float]) -> dict:
    """The geometric mean of the ratios and its 95 % t-interval, with the half-width in percent."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.inf
    return {"ratio": round(math.exp(mean), 4), "ci": [round(math.exp(mean - half), 4), round(math.exp(mean + half), 4)],
            "halfwidth_pct": round((math.exp(half) - 1) * 100, 2), "blocks": len(ratios)}


def order(design: str, bodies: list) -> list[tuple[str, object]]:
    """The block's requests in the order they are sent: (server, request); each request once to each server."""
    if design == "windows":
        return [("A", b) for b in bodies] + [("B", b) for b in bodies]
    return [(s, b) for i, b in enumerate(bodies) for s in (("A", "B") if i % 2 == 0 else ("B", "A"))]


async def one_block(clients: dict, bodies: list[dict], design: str) -> float:
    """B's output tok/s over A's in one block; each request alone on its server (concurrency 1)."""
    tokens, seconds = {"A": 0, "B": 0}, {"A": 0.0, "B": 0.0}
    for server, body in order(design, bodies):
        t0 = time.perf_counter()
        result = await clients[server].chat(body)
        seconds[server] += time.perf_counter() - t0
        tokens[server] += result.completion_tokens
    return (tokens["B"] / seconds["B"]) / (tokens["A"] / seconds["A"])


async def measure(urls: dict, key: str, bodies: list[dict], blocks: int, rounds: int) -> dict:
    """`rounds` times each design, in turn (drift meets both alike); a block's prompts are the same in both."""
    per_block = len(bodies) // blocks
    ratios: dict[str, list[float]] = {d: [] for d in DESIGNS}
    async with OpenAIClient(urls["A"], api_key=key) as a, OpenAIClient(urls["B"], api_key=key) as b:
        clients = {"A": a, "B": b}
        for body in bodies[:2]:  # warm-up, unrecorded
            await a.chat(body), await b.chat(body)
        for r in range(rounds):
            for design in (DESIGNS if r % 2 == 0 else DESIGNS[::-1]):
                for i in range(blocks):
                    ratios[design].append(await one_block(clients, bodies[i * per_block:(i + 1) * per_block], design))
    return {d: {**interval(v), "per_block": [round(x, 4) for x in v]} for d, v in ratios.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, help="a profile (its bench server, target and sampling); default: the tiny CPU one")
    ap.add_argument("--prompts", type=Path, help="default: the config's bench prompts")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--per-block", type=int, default=8, help="requests per server per block")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true",
                    help="2 blocks of 2 requests, one round, one server as both A and B (CI): not a measurement")
    args = ap.parse_args()
    if args.smoke:
        args.blocks, args.per_block, args.rounds, args.max_tokens = 2, 2, 1, 8
    with tempfile.TemporaryDirectory(prefix="eagle3-alternation-") as tmp:
        if args.config:
            cfg = load_config(args.config)
            base_port = free_port((0, 1))
        else:
            cfg = write_tiny_config(Path(tmp), {"bench": {"server": {"port": free_port((0, 1))}}})
            base_port = cfg.bench.server.port
        sup = Supervisor(Path(tmp) / "state")
        # the tiny config's own bench and datagen prompts are one row: the tiny set's 96 instead
        prompts = load_prompts(args.prompts or cfg.bench.prompts or REPO / "configs" / "prompts" / "tiny-prompts.jsonl",
                               args.blocks * args.per_block)
        if len(prompts.prompts) < args.blocks * args.per_block:
            sys.exit(f"{len(prompts.prompts)} prompts, {args.blocks * args.per_block} needed: fewer blocks or requests")
        # ignore_eos: every request the same length whatever the text, so the ratio is speed alone
        bodies = [{"model": cfg.target.served_name, "messages": list(p.messages), "max_tokens": args.max_tokens,
                   "temperature": 0.0, "ignore_eos": True} for p in prompts.prompts]
        servers, procs = {}, []
        try:
            for i, name in enumerate("A" if args.smoke else "AB"):
                servers[name] = cfg.bench.server.model_copy(update={"port": base_port + i})
                procs.append(start_server(sup, cfg, "bench", cfg.bench.engine, servers[name], instance=f"aa-{name}"))
            servers.setdefault("B", servers["A"])  # the smoke: the script's whole path on one start, not two
            urls = {n: base_url(s) for n, s in servers.items()}
            result = asyncio.run(measure(urls, api_key(cfg, servers["A"], "bench.server"), bodies, args.blocks,
                                         args.rounds))
        finally:
            for proc in procs:
                proc.stop()
    for design in DESIGNS:
        r = result[design]
        print(f"{design:>11}: B/A {r['ratio']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}], half-width "
              f"{r['halfwidth_pct']:.2f} % over {r['blocks']} blocks", flush=True)
    print(f"half-width alternating / windows: {result['alternating']['halfwidth_pct'] / result['windows']['halfwidth_pct']:.3f}")
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
           "cpus": os.cpu_count(), "config": str(args.config or "tiny CPU config (tests.conftest)"),
           "target": str(cfg.target.model), "blocks": args.blocks, "per_block": args.per_block, "rounds": args.rounds,
           "max_tokens": args.max_tokens, "smoke": args.smoke, **result}
    if args.json:
        atomic_write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
