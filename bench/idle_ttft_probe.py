"""Does a server answer late after it has been idle for a while? One server of a profile's benchmark
settings, alone on the machine, gets one request at a time, each after an idle gap drawn from --gaps
(every gap --reps times, in a shuffled order); each request's time to first token and TPOT are kept.

Why: in bench.schedule alternating every request reaches a server that has sat idle while the others
took their turns, for one to (servers - 1) requests' time. On the 2-core box (vLLM 0.32 CPU, real
SmolLM2, three servers) the pack's A/A twin came out at +-19-21 % alternating against +-3-6 % interleaved,
and the requests sent after their server had been idle 1-1.5 s had a median TTFT of ~1,000 ms against ~70 ms
(bench/RESULTS.md, 2026-12-05). This probe asks whether the engine does that on its own, without
neighbours, and with --neighbour whether a second server that has just answered does it: then half the
requests (shuffled) are sent right after one request to the neighbour, the other half alone.

    .venv/bin/python bench/idle_ttft_probe.py --json bench/results/idle-ttft-cpu-DATE.json
    .venv/bin/python bench/idle_ttft_probe.py --neighbour --json ...   # a second server answers just before
    .venv/bin/python bench/idle_ttft_probe.py --config configs/h200-smollm2.yaml ...   # the GPU profile
    .venv/bin/python bench/idle_ttft_probe.py --smoke    # tiny target, 2 gaps once each: not a measurement
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.config import load_config  # noqa: E402
from eagle3.engines.serving import api_key, base_url, start_server  # noqa: E402
from eagle3.fsio import atomic_write_json  # noqa: E402
from eagle3.openai_client import OpenAIClient  # noqa: E402
from eagle3.process.services import Supervisor  # noqa: E402
from eagle3.prompts import load_prompts  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402
from tests.ports import free_port  # noqa: E402

DEMO = REPO / "configs" / "smollm2-cpu.yaml"


async def measure(url: str, key: str | None, bodies: list[dict], plan: list[tuple[float, bool]],
                  neighbour_url: str | None = None) -> list[dict]:
    """Each (gap, after_neighbour) of plan: sleep gap, then (if after_neighbour) one request to the
    neighbour, then the measured request at once."""
    rows = []
    async with OpenAIClient(url, api_key=key, max_connections=1) as client, \
            OpenAIClient(neighbour_url or url, api_key=key, max_connections=1) as neighbour:
        await client.chat_timed(bodies[0])  # the first request after the start is not an idle gap's
        if neighbour_url:
            await neighbour.chat_timed(bodies[0])
        for i, (gap, after_neighbour) in enumerate(plan):
            await asyncio.sleep(gap)
            if after_neighbour:
                await neighbour.chat_timed(bodies[i % len(bodies)])
            timed = await client.chat_timed(bodies[(i + 1) % len(bodies)])
            rows.append({"gap_s": gap, "after_neighbour": after_neighbour, "ttft_ms": timed.ttft_ms,
                         "tpot_ms": timed.tpot_ms, "latency_ms": timed.latency_ms, "output_tokens": timed.output_tokens})
    return rows


def by_gap(rows: list[dict]) -> list[dict]:
    out = []
    for gap, after in sorted({(r["gap_s"], r["after_neighbour"]) for r in rows}):
        mine = [r for r in rows if (r["gap_s"], r["after_neighbour"]) == (gap, after)]
        ttft = [r["ttft_ms"] for r in mine]
        tpot = [r["tpot_ms"] for r in mine if r["tpot_ms"] is not None]
        out.append({"gap_s": gap, "after_neighbour": after, "n": len(ttft),
                    "median_ttft_ms": round(statistics.median(ttft), 1), "max_ttft_ms": round(max(ttft), 1),
                    "median_tpot_ms": round(statistics.median(tpot), 2) if tpot else None})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=DEMO, help="a profile (its bench server, target); default: the CPU demo's")
    ap.add_argument("--gaps", type=float, nargs="+", default=[0, 0.5, 0.9, 1.1, 1.5, 2, 3, 5])
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--neighbour", action="store_true", help="a second server; half the requests follow one to it")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="the tiny target, 2 gaps once each (CI): not a measurement")
    args = ap.parse_args()
    if args.smoke:
        args.gaps, args.reps, args.max_tokens = [0, 0.2], 1, 4
    plan = [(g, after) for g in args.gaps for after in ((False, True) if args.neighbour else (False,))
            for _ in range(args.reps)]
    random.Random(args.seed).shuffle(plan)  # no gap always follows the same one
    with tempfile.TemporaryDirectory(prefix="eagle3-idle-ttft-") as tmp:
        if args.smoke:
            cfg = write_tiny_config(Path(tmp), {"bench": {"server": {"port": free_port((0, 1))}}})
            prompts_file = REPO / "configs" / "prompts" / "tiny-prompts.jsonl"
        else:
            cfg = load_config(args.config)
            cfg = cfg.model_copy(update={"bench": cfg.bench.model_copy(update={
                "server": cfg.bench.server.model_copy(update={"port": free_port((0, 1))})})})
            prompts_file = cfg.bench.prompts
        prompts = load_prompts(prompts_file, 16).prompts
        bodies = [{"model": cfg.target.served_name, "messages": list(p.messages), "max_tokens": args.max_tokens,
                   "temperature": 0.0, "ignore_eos": True} for p in prompts]
        sup = Supervisor(Path(tmp) / "state")
        servers = [cfg.bench.server] + ([cfg.bench.server.model_copy(update={"port": free_port((0, 1))})]
                                        if args.neighbour else [])
        procs = []
        try:
            for i, server in enumerate(servers):
                procs.append(start_server(sup, cfg, "bench", cfg.bench.engine, server, [], instance=f"idle-ttft-{i}"))
            rows = asyncio.run(measure(base_url(servers[0]), api_key(cfg, cfg.bench.server, "bench.server"), bodies,
                                       plan, base_url(servers[1]) if args.neighbour else None))
        finally:
            for proc in procs:
                proc.stop()
    summary = by_gap(rows)
    for s in summary:
        print(f"idle {s['gap_s']:>4} s{', just after the neighbour' if s['after_neighbour'] else ', alone':<25}: TTFT median {s['median_ttft_ms']:8.1f} ms (max {s['max_ttft_ms']:.1f}), "
              f"TPOT median {s['median_tpot_ms']} ms, n={s['n']}", flush=True)
    if args.json:
        atomic_write_json(args.json, {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
            "cpus": os.cpu_count(), "config": str(args.config if not args.smoke else "tiny CPU config"),
            "target": str(cfg.target.model), "prompts": str(prompts_file), "max_tokens": args.max_tokens,
            "reps": args.reps, "neighbour": args.neighbour, "smoke": args.smoke, "by_gap": summary, "requests": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
