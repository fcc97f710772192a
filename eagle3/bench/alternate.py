"""bench.schedule alternating: within a window slot the servers take turns request by request.

At concurrency c the slot's prompts go out c at a time: each turn sends the same c prompts to every
server in turn, the first server rotating from turn to turn, so that every server meets the machine
within the same second as the others. On the H200 a host-bound 135 M target's speed moved by 8-16 % in
levels lasting seconds (run6); on one H100 an A/A pair's interval came to ±1.98 % this way against
±5.48 % in blocks of 8 requests, over the same requests (bench/alternation_probe.py, one run:
bench/RESULTS.md, 2026-12-05). Each server's share of a slot
becomes one window in the load generator's vocabulary (loadgen.LoadResult), with its requests, so
the rest of the phase (pairing by slot, intervals, verdicts) is the same as for the other schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import statistics
import time
from pathlib import Path

from ..engines.loadgen import LoadResult
from ..fsio import atomic_write_json
from ..openai_client import OpenAIClient, TimedChat


def turn_order(servers: int, turn: int) -> list[int]:
    """The servers' order in one turn: all of them, the first rotating by one each turn."""
    return [(turn + j) % servers for j in range(servers)]


async def run_slot(urls: list[str], api_key: str | None, payloads: list[dict], concurrency: int,
                   hang_timeout_s: float = 600.0) -> tuple[list[list[TimedChat]], list[float]]:
    """Every payload once to every server, `concurrency` at a time, the servers taking turns.
    Returns each server's requests and the seconds its turns took (its window's duration). A server
    that sends nothing for hang_timeout_s fails the slot."""
    done: list[list[TimedChat]] = [[] for _ in urls]
    busy = [0.0] * len(urls)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(OpenAIClient(u, api_key=api_key, max_connections=concurrency,
                                                                    read_timeout_s=hang_timeout_s))
                   for u in urls]
        for turn, start in enumerate(range(0, len(payloads), concurrency)):
            group = payloads[start:start + concurrency]
            for i in turn_order(len(urls), turn):
                t0 = time.perf_counter()
                done[i] += await asyncio.gather(*(clients[i].chat_timed(p) for p in group))
                busy[i] += time.perf_counter() - t0
    return done, busy


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 3)


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def load_result(requests: list[TimedChat], seconds: float, raw_file: Path) -> LoadResult:
    """One server's share of a slot as a window; its requests written to raw_file."""
    tokens = sum(r.output_tokens for r in requests)
    ttft = [r.ttft_ms for r in requests]
    tpot = [r.tpot_ms for r in requests if r.tpot_ms is not None]
    # chunks: the pieces after the first token, as vLLM's load generator counts them (its inter-token
    # gaps), so that output tokens per chunk means the same from either client
    rows = [{"output_tokens": r.output_tokens, "ttft_ms": r.ttft_ms, "latency_ms": r.latency_ms,
             "chunks": max(0, r.chunks - 1), "started_at": r.started_at} for r in requests]
    atomic_write_json(raw_file, {"duration_s": seconds, "requests": rows})
    seconds = max(seconds, 1e-9)
    return LoadResult(completed=len(requests), failed=0, duration_s=round(seconds, 4),
                      total_input_tokens=sum(r.prompt_tokens for r in requests), total_output_tokens=tokens, request_throughput=round(len(requests) / seconds, 4),
                      output_throughput=round(tokens / seconds, 3), mean_ttft_ms=_mean(ttft),
                      median_ttft_ms=_pct(ttft, 0.5), p99_ttft_ms=_pct(ttft, 0.99), mean_tpot_ms=_mean(tpot),
                      median_tpot_ms=_pct(tpot, 0.5), p99_tpot_ms=_pct(tpot, 0.99), mean_itl_ms=None,
                      mean_e2el_ms=_mean([r.latency_ms for r in requests]), client_spec=None,
                      raw_file=str(raw_file), requests=rows)
