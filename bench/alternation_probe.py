"""Does finer interleaving narrow an A/A interval (issue 37)? Two servers of one config (A and its twin
B), and with --drafter a third serving that drafter at --k (S), get the same greedy requests, one at a
time, two ways in turn:

  - windows:     block after block, W requests to A, then W to B (then W to S): the benchmark's window slots;
  - alternating: within each block, the servers take turns request by request, the first of each turn
                 rotating (A B S, B S A, S A B, ...), so all see the machine within the same second.

Each block gives one ratio per server against A (its output tok/s over A's), and the interval is the
95 % t-interval of the blocks' log ratios. Both designs have the same blocks, requests and servers. On
the H200 a window's speed moved 8-16 % in levels that last seconds: run6's per-request TPOT has a lag-1
autocorrelation of 0.67 at concurrency 1. If those levels are the machine's, not one server's,
alternating cancels them and its interval is the narrower one. A/A: B/A must contain 1; S/A is the
drafter's speedup at concurrency 1 under each design.

    .venv/bin/python bench/alternation_probe.py --blocks 10 --per-block 8 --rounds 2 --json FILE
    .venv/bin/python bench/alternation_probe.py --config configs/h200-smollm2.yaml ...   # the GPU profile
    .venv/bin/python bench/alternation_probe.py --config ... --drafter DIR --k 3      # and a drafter's speedup
    .venv/bin/python bench/alternation_probe.py --smoke     # 2 blocks of 2 requests on one server, not a measurement
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from eagle3.bench.alternate import turn_order  # noqa: E402
from eagle3.bench.repeats import t975  # noqa: E402
from eagle3.bench.starts import graph_sizes  # noqa: E402
from eagle3.config import load_config  # noqa: E402
from eagle3 import engine_registry  # noqa: E402
from eagle3.engines.metrics import acceptance  # noqa: E402
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


def order(design: str, bodies: list, names: tuple[str, ...] = ("A", "B")) -> list[tuple[str, object]]:
    """The block's requests in the order they are sent: (server, request); each request once to each server."""
    if design == "windows":
        return [(n, b) for n in names for b in bodies]
    return [(names[j], b) for i, b in enumerate(bodies) for j in turn_order(len(names), i)]


async def one_block(clients: dict, bodies: list[dict], design: str) -> dict[str, float]:
    """Each other server's output tok/s over A's in one block; each request alone on its server (concurrency 1)."""
    names = tuple(clients)
    tokens, seconds = dict.fromkeys(names, 0), dict.fromkeys(names, 0.0)
    for server, body in order(design, bodies, names):
        t0 = time.perf_counter()
        result = await clients[server].chat(body)
        seconds[server] += time.perf_counter() - t0
        tokens[server] += result.completion_tokens
    speed = {n: tokens[n] / seconds[n] for n in names}
    return {f"{n}/A": speed[n] / speed["A"] for n in names[1:]}


async def measure(urls: dict, key: str, bodies: list[dict], blocks: int, rounds: int) -> dict:
    """`rounds` times each design, in turn (drift meets both alike); a block's prompts are the same in both."""
    per_block = len(bodies) // blocks
    pairs = [f"{n}/A" for n in list(urls)[1:]]
    ratios: dict[str, dict[str, list[float]]] = {d: {p: [] for p in pairs} for d in DESIGNS}
    async with contextlib.AsyncExitStack() as stack:
        clients = {n: await stack.enter_async_context(OpenAIClient(u, api_key=key)) for n, u in urls.items()}
        for body in bodies[:2]:  # warm-up, unrecorded
            for client in clients.values():
                await client.chat(body)
        for r in range(rounds):
            for design in (DESIGNS if r % 2 == 0 else DESIGNS[::-1]):
                for i in range(blocks):
                    block = await one_block(clients, bodies[i * per_block:(i + 1) * per_block], design)
                    for pair, x in block.items():
                        ratios[design][pair].append(x)
    return {d: {p: {**interval(v), "per_block": [round(x, 4) for x in v]} for p, v in by_pair.items()}
            for d, by_pair in ratios.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, help="a profile (its bench server, target and sampling); default: the tiny CPU one")
    ap.add_argument("--prompts", type=Path, help="default: the config's bench prompts")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--per-block", type=int, default=8, help="requests per server per block")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--drafter", type=Path, help="a trained drafter: a third server S serves it at --k")
    ap.add_argument("--k", type=int, default=3, help="speculative tokens for --drafter")
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
        engine = engine_registry.get(cfg.bench.engine)
        # as the benchmark serves them: CUDA graphs for exactly the token counts a step at concurrency 1 has
        plan = {"A": 0} if args.smoke else {"A": 0, "B": 0, **({"S": args.k} if args.drafter else {})}
        servers, procs = {}, []
        try:
            for i, (name, k) in enumerate(plan.items()):
                servers[name] = cfg.bench.server.model_copy(update={"port": base_port + i, "extra_args": (
                    engine.with_graph_sizes(list(cfg.bench.server.extra_args), graph_sizes(k, [1])))})
                extra = engine.spec_args(args.drafter, k) if k else []
                procs.append(start_server(sup, cfg, "bench", cfg.bench.engine, servers[name], extra,
                                          instance=f"aa-{name}"))
            servers.setdefault("B", servers["A"])  # the smoke: the script's whole path on one start, not two
            urls = {n: base_url(servers[n]) for n in ("A", "B", *(("S",) if "S" in servers else ()))}
            key = api_key(cfg, servers["A"], "bench.server")
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            counters = lambda: engine.scrape(urls["S"], args.k, cfg.target.served_name, headers)[0]  # noqa: E731
            before = counters() if "S" in urls else None
            result = asyncio.run(measure(urls, key, bodies, args.blocks, args.rounds))
            if before is not None:  # the drafter's acceptance over every request S served (warm-up included)
                result["acceptance_S"] = acceptance(counters() - before, engine.acceptance_source).to_dict()
        finally:
            for proc in procs:
                proc.stop()
    for design in DESIGNS:
        for pair, r in result[design].items():
            print(f"{design:>11}: {pair} {r['ratio']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}], half-width "
                  f"{r['halfwidth_pct']:.2f} % over {r['blocks']} blocks", flush=True)
    if "acceptance_S" in result:
        print(f"S (k = {args.k}) acceptance length {result['acceptance_S']['acceptance_length']}")
    for pair in result["windows"]:
        narrow = result["alternating"][pair]["halfwidth_pct"] / result["windows"][pair]["halfwidth_pct"]
        print(f"{pair} half-width alternating / windows: {narrow:.3f}")
    out = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
           "cpus": os.cpu_count(), "config": str(args.config or "tiny CPU config (tests.conftest)"),
           "target": str(cfg.target.model), "blocks": args.blocks, "per_block": args.per_block, "rounds": args.rounds,
           "max_tokens": args.max_tokens, "smoke": args.smoke,
           "drafter": str(args.drafter) if args.drafter else None, "k": args.k if args.drafter else None, **result}
    if args.json:
        atomic_write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
