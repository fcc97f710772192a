"""The benchmark's figures with their 95 % intervals, from one run's own data (the watch compares them
across runs: eagle3/bench/watch.py).

Figures, per (k, concurrency) (k = 0: the baseline), each with a 95 % interval from the run's own data:
  output_tok_s, mean_tpot_ms  with bench.windows >= 2 (or rounds >= 2): the mean over the windows and a
                              t interval over them, which holds what varies between windows and, across
                              rounds, between server starts. With one window: a bootstrap over the
                              window's completed requests (vLLM's client saves
                              each request's output tokens, TTFT and latency): TPOT is the mean of the
                              per-request TPOTs, as the client computes it; throughput is scaled by the
                              resampled tokens/latency ratio. No per-request data (SGLang): no interval.
  speedup                     k's output tok/s over the same run's baseline at that concurrency, paired
                              window slot by window slot where the servers ran at once (the drift of the
                              node cancels), with its interval (eagle3/bench/stats.py); one window a side:
                              the two servers' intervals combined as independent.
  acceptance_length,          the value from the server's counters; the interval from a bootstrap over
  per_position[i]             requests of a per-request proxy: output tokens per streamed chunk (one
                              verify step's tokens arrive as one chunk; on the recorded CPU runs the
                              pooled proxy is within 3 % of the counters' length), applied as a relative
                              interval (per position: to the accepted share). Without per-request data:
                              from the per-position counters (position i's rate is the share of drafts
                              with more than i tokens accepted: the distribution of accepted tokens per
                              draft and its variance), divided by the effective number of requests, not
                              of drafts (drafts of one request are not independent): conservative.
"""

from __future__ import annotations

import math
import random

from .. import engine_registry
from .repeats import mean_interval
from .stats import pool_windows, table, windows_by_point

Z = 1.96              # 95 % two-sided
BOOTSTRAP = 1000      # resamples; seeded, so a result's intervals are the same on every read
HIGHER_IS_BETTER = {"output_tok_s": True, "mean_tpot_ms": False, "acceptance_length": True, "per_position": True,
                    "speedup": True}

# ---- figures with intervals ----------------------------------------------------------------------

def _interval(value: float | None, lo: float | None, hi: float | None, method: str) -> dict:
    return {"value": value, "lo": lo, "hi": hi, "method": method}


def _bootstrap(requests: list[dict], stat, seed: int) -> tuple[float, float] | None:
    if len(requests) < 2:
        return None
    rng = random.Random(seed)
    n = len(requests)
    values = sorted(stat([requests[rng.randrange(n)] for _ in range(n)]) for _ in range(BOOTSTRAP))
    return values[int(0.025 * BOOTSTRAP)], values[int(0.975 * BOOTSTRAP) - 1]


def _tpot(reqs: list[dict]) -> float:
    tpots = [(r["latency_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1) for r in reqs if r["output_tokens"] > 1]
    return sum(tpots) / len(tpots) if tpots else math.nan


def _rate(reqs: list[dict]) -> float:
    return sum(r["output_tokens"] for r in reqs) / max(1e-9, sum(r["latency_ms"] for r in reqs))


def speed_figures(load: dict, seed: int = 0) -> dict:
    reqs = load.get("requests") or []
    tok_s, tpot = load.get("output_throughput"), load.get("mean_tpot_ms")
    method = f"bootstrap over {len(reqs)} requests"
    out = {"output_tok_s": _interval(tok_s, None, None, "no per-request data"),
           "mean_tpot_ms": _interval(tpot, None, None, "no per-request data")}
    rate = _rate(reqs) if reqs else 0.0
    if tok_s is not None and rate > 0 and (ci := _bootstrap(reqs, _rate, seed)):
        out["output_tok_s"] = _interval(tok_s, tok_s * ci[0] / rate, tok_s * ci[1] / rate, method)
    if tpot is not None and (ci := _bootstrap(reqs, _tpot, seed + 1)):
        out["mean_tpot_ms"] = _interval(tpot, ci[0], ci[1], method)
    return out


def _effective_requests(load: dict) -> float:
    """Kish's effective sample size of requests weighted by their drafts (~ output tokens)."""
    lens = [r["output_tokens"] for r in load.get("requests") or []]
    if lens and sum(x * x for x in lens):
        return sum(lens) ** 2 / sum(x * x for x in lens)
    return float(load.get("completed") or 0)


def _tokens_per_chunk(reqs: list[dict]) -> float:
    return sum(r["output_tokens"] - 1 for r in reqs) / max(1, sum(r["chunks"] for r in reqs))


def acceptance_figures(acc: dict | None, load: dict, seed: int = 0) -> dict:
    """Acceptance length and per-position rates with their intervals (see the module docstring)."""
    if not acc or acc.get("acceptance_length") is None:
        return {}
    rates, length = list(acc.get("per_position") or []), acc["acceptance_length"]
    reqs = [r for r in load.get("requests") or [] if "chunks" in r]
    ratio = _tokens_per_chunk(reqs) if reqs else 0.0
    if ratio > 0 and length > 1 and (ci := _bootstrap(reqs, _tokens_per_chunk, seed)):
        # The counters give the value; the spread of the per-request acceptance proxy gives the
        # interval, as a relative one. Per position: the same relative interval of the accepted share.
        lo, hi = length * ci[0] / ratio, length * ci[1] / ratio
        scale = ((lo - 1) / (length - 1), (hi - 1) / (length - 1))
        method = f"bootstrap over {len(reqs)} requests (output tokens per streamed chunk)"
        return {"acceptance_length": _interval(length, lo, hi, method),
                "per_position": [_interval(p, max(0.0, p * scale[0]), min(1.0, p * scale[1]), method) for p in rates]}
    n = _effective_requests(load)
    if not rates or n < 1:
        return {"acceptance_length": _interval(length, None, None, "no per-position counters"),
                "per_position": [_interval(p, None, None, "no per-position counters") for p in rates]}
    # P(accepted >= j) = rates[j-1]: E[X] = sum q_j, E[X^2] = sum (2j - 1) q_j.
    mean = sum(rates)
    var = max(0.0, sum((2 * j + 1) * q for j, q in enumerate(rates)) - mean * mean)
    half = Z * math.sqrt(var / n)
    method = f"per-position counters, {n:.1f} effective requests"
    per_pos = []
    for p in rates:
        h = Z * math.sqrt(max(0.0, p * (1 - p)) / n)
        per_pos.append(_interval(p, max(0.0, p - h), min(1.0, p + h), method))
    return {"acceptance_length": _interval(length, length - half, length + half, method), "per_position": per_pos}


def figures(results: dict) -> dict[str, dict]:
    """{"k3-c4": {"k", "concurrency", "output_tok_s", "mean_tpot_ms", "acceptance_length", "per_position"}},
    over every window of that point (all rounds). Speed: with >= 2 windows their mean and a t interval
    over windows (what varies between windows and server starts; eagle3/bench/repeats.py), else the one
    window's per-request bootstrap. Acceptance: the windows' counters pooled, the interval as above."""
    points = windows_by_point(results.get("servers", []))
    out = {}
    for (k, c), windows in points.items():
        seed = 1000 * k + c
        if len(windows) > 1:
            loads = [w["load"] for w in windows]
            speed = {"output_tok_s": _from_repeats([x.get("output_throughput") for x in loads]),
                     "mean_tpot_ms": _from_repeats([x.get("mean_tpot_ms") for x in loads])}
        else:
            speed = speed_figures(windows[0]["load"], seed=seed)
        out[f"k{k}-c{c}"] = {"k": k, "concurrency": c, "windows": len(windows), **speed,
                             **acceptance_figures(_pooled_acceptance(windows, results.get("engine", engine_registry.DEFAULT)),
                                                  _merged_load(windows), seed=seed + 500)}
    rows = table(results.get("servers", []), results.get("engine", engine_registry.DEFAULT)) if out else []
    for key, f in out.items():
        if f["k"] and (base := out.get(f"k0-c{f['concurrency']}")):
            f["speedup"] = _speedup(rows, f, base)
    return out


def _speedup(rows: list[dict], point: dict, base: dict) -> dict:
    """The paired speedup of the run's own table (its interval over window slots), or, with one window a
    side, the ratio of the two throughputs with their relative errors combined as independent."""
    row = next((r for r in rows if r["k"] == point["k"] and r["concurrency"] == point["concurrency"]), None)
    if row and row.get("speedup") is not None and row.get("speedup_ci"):
        lo, hi = row["speedup_ci"]
        return _interval(row["speedup"], lo, hi, row.get("speedup_method") or "paired over window slots")
    a, b = point["output_tok_s"], base["output_tok_s"]
    if not (a.get("value") and b.get("value")):
        return _interval(None, None, None, "no baseline")
    value = a["value"] / b["value"]
    if None in (a.get("lo"), a.get("hi"), b.get("lo"), b.get("hi")):
        return _interval(value, None, None, "no interval on a side")
    rel = math.hypot((a["hi"] - a["lo"]) / (2 * a["value"]), (b["hi"] - b["lo"]) / (2 * b["value"]))
    return _interval(value, value * (1 - rel), value * (1 + rel), "ratio of the two servers' intervals")


def _from_repeats(values: list) -> dict:
    m = mean_interval(values)
    return _interval(m["value"], m["lo"], m["hi"], m["method"])


def _pooled_acceptance(windows: list[dict], engine: str) -> dict | None:
    return windows[0].get("acceptance") if len(windows) == 1 else pool_windows(windows, engine)


def _merged_load(windows: list[dict]) -> dict:
    if len(windows) == 1:
        return windows[0]["load"]
    requests = [r for w in windows for r in (w["load"].get("requests") or [])]
    return {"completed": sum(w["load"].get("completed") or 0 for w in windows), "requests": requests or None}


