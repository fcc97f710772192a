"""The benchmark watch: every result compared with its history (bench-history/*.json), so a
scheduled rerun notices when something changed (a new engine release, driver, re-export, config edit).

Figures, per (k, concurrency) (k = 0: the baseline), each with a 95 % interval from the run's own data:
  output_tok_s, mean_tpot_ms  with bench.windows >= 2 (or rounds >= 2): the mean over the windows and a
                              t interval over them, which holds what varies between windows and, across
                              rounds, between server starts. With one window: a bootstrap over the
                              window's completed requests (vLLM's client saves
                              each request's output tokens, TTFT and latency): TPOT is the mean of the
                              per-request TPOTs, as the client computes it; throughput is scaled by the
                              resampled tokens/latency ratio. No per-request data (SGLang): no interval.
  acceptance_length,          the value from the server's counters; the interval from a bootstrap over
  per_position[i]             requests of a per-request proxy: output tokens per streamed chunk (one
                              verify step's tokens arrive as one chunk; on the recorded CPU runs the
                              pooled proxy is within 3 % of the counters' length), applied as a relative
                              interval (per position: to the accepted share). Without per-request data:
                              from the per-position counters (position i's rate is the share of drafts
                              with more than i tokens accepted: the distribution of accepted tokens per
                              draft and its variance), divided by the effective number of requests, not
                              of drafts (drafts of one request are not independent): conservative.

The reference is the last good run (not itself a regression) of the same setup: same target,
drafter checksum, engine and measurement settings (prompts, sampling, output length). A figure is a
regression when it is worse beyond the noise and by more than the tolerance. The noise combines
both runs' intervals with the spread of the figure over the earlier good runs of the setup (from two
on): one run's interval misses what varies between runs (server start, clocks, other load; on the
shared 2-core CPU box back-to-back runs differed by up to 40 % in tok/s, recorded in
tests/fixtures/bench-history/). On a CPU rehearsal speed changes are reported, not judged. A
regression fails the run, naming what changed since the reference (engine version, config
fingerprint, driver, GPU, pack version), or saying that nothing recorded did.
A run whose setup differs from every earlier one (a new drafter, new prompts) is a new baseline:
reported, never failed.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from .repeats import mean_interval
from .stats import pool_windows, windows_by_point

Z = 1.96              # 95 % two-sided
BOOTSTRAP = 1000      # resamples; seeded, so a result's intervals are the same on every read
HIGHER_IS_BETTER = {"output_tok_s": True, "mean_tpot_ms": False, "acceptance_length": True, "per_position": True}

# What makes two results comparable (a difference: a new baseline) ...
IDENTITY = {
    "target": lambda r: r["target"]["model"],
    "drafter checksum": lambda r: (r["drafter"].get("checksum") or r["drafter"]["path"]),
    "engine": lambda r: r["engine"],
    "prompts": lambda r: r["prompts"].get("sha256"),
    "sampling": lambda r: json.dumps(r["sampling"], sort_keys=True),
}
# ... and what may change between comparable runs; a regression names those that did.
ENVIRONMENT = {
    "engine version": lambda r: r.get("engine_version"),
    "config fingerprint": lambda r: r.get("config_hash"),
    "driver": lambda r: (r.get("platform") or {}).get("driver"),
    "GPU": lambda r: (r.get("platform") or {}).get("gpu_names"),
    "pack version": lambda r: r.get("pack_version"),
}


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
                             **acceptance_figures(_pooled_acceptance(windows, results.get("engine", "vllm")),
                                                  _merged_load(windows), seed=seed + 500)}
    return out


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


# ---- comparison ----------------------------------------------------------------------------------

def _se(f: dict) -> float | None:
    return None if f.get("lo") is None or f.get("hi") is None else (f["hi"] - f["lo"]) / (2 * Z)


def compare_figure(name: str, cur: dict, ref: dict, tolerance_pct: float, between_sd: float = 0.0) -> dict | None:
    """Verdict on one figure: regression / improvement (beyond the noise and the tolerance) / within
    noise. The noise: both runs' intervals, plus the spread between earlier runs of the same setup."""
    a, b = cur.get("value"), ref.get("value")
    if a is None or b is None:
        return None
    diff = a - b
    se_a, se_b = _se(cur), _se(ref)
    noise = Z * math.sqrt(se_a ** 2 + se_b ** 2 + between_sd ** 2) if se_a is not None and se_b is not None else None
    beyond_noise = noise is None or abs(diff) > noise
    relative = abs(diff) / abs(b) * 100 if b else (0.0 if not diff else math.inf)
    worse = diff < 0 if HIGHER_IS_BETTER[name.split("[")[0]] else diff > 0
    verdict = "within noise"
    if beyond_noise and relative > tolerance_pct:
        verdict = "regression" if worse else "improvement"
    return {"figure": name, "value": a, "lo": cur.get("lo"), "hi": cur.get("hi"), "reference": b,
            "reference_lo": ref.get("lo"), "reference_hi": ref.get("hi"), "change_pct": round(diff / b * 100, 2) if b else None,
            "noise": noise, "verdict": verdict}


def _flat(figs: dict[str, dict]) -> dict[tuple[str, str], dict]:
    out = {}
    for key, f in figs.items():
        for name in ("output_tok_s", "mean_tpot_ms", "acceptance_length"):
            if name in f:
                out[(key, name)] = f[name]
        for i, p in enumerate(f.get("per_position", [])):
            out[(key, f"per_position[{i}]")] = p
    return out


def between_runs_sd(earlier: list[dict]) -> dict[tuple[str, str], float]:
    """Per figure, the standard deviation of its value over earlier good runs of the same setup
    (repeated measurements: what a rerun varies by beyond one run's own interval); needs >= 2 runs."""
    values: dict[tuple[str, str], list[float]] = {}
    for r in earlier:
        for key, f in _flat(figures(r)).items():
            if f.get("value") is not None:
                values.setdefault(key, []).append(f["value"])
    out = {}
    for key, xs in values.items():
        if len(xs) >= 2:
            m = sum(xs) / len(xs)
            out[key] = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return out


def compare(cur: dict, ref: dict, acceptance_tol_pct: float, speed_tol_pct: float,
            between: dict[tuple[str, str], float] | None = None) -> list[dict]:
    """Every figure of `cur` that `ref` has too, with its verdict. On a CPU rehearsal the speed
    figures are reported, not judged: a shared CPU box varies between runs far beyond one run's noise."""
    fc, fr = figures(cur), figures(ref)
    between = between or {}
    cpu = bool(cur.get("cpu_rehearsal"))
    rows = []
    for key in fc.keys() & fr.keys():
        a, b = fc[key], fr[key]
        where = f"k={a['k']} c={a['concurrency']}" if a["k"] else f"baseline c={a['concurrency']}"
        pairs = [(n, a[n], b[n], speed_tol_pct) for n in ("output_tok_s", "mean_tpot_ms")]
        if "acceptance_length" in a and "acceptance_length" in b:
            pairs.append(("acceptance_length", a["acceptance_length"], b["acceptance_length"], acceptance_tol_pct))
            pairs += [(f"per_position[{i}]", x, y, acceptance_tol_pct)
                      for i, (x, y) in enumerate(zip(a["per_position"], b["per_position"]))]
        for name, x, y, tol in pairs:
            if row := compare_figure(name, x, y, tol, between.get((key, name), 0.0)):
                if cpu and name in ("output_tok_s", "mean_tpot_ms") and row["verdict"] != "within noise":
                    row["verdict"] = f"{row['verdict']} (not judged: CPU rehearsal)"
                rows.append({"where": where, "k": a["k"], "concurrency": a["concurrency"], **row})
    return sorted(rows, key=lambda r: (r["k"], r["concurrency"], r["figure"]))


def _differences(fields: dict, cur: dict, ref: dict) -> list[str]:
    out = []
    for name, get in fields.items():
        x, y = get(ref), get(cur)
        if x != y:
            out.append(f"{name} {_short(x)} -> {_short(y)}")
    return out


def _short(v) -> str:
    s = "/".join(map(str, v)) if isinstance(v, list) else str(v)
    return s[:12] if isinstance(v, str) and len(s) == 64 else s  # a sha256: its first 12 digits


def read_history(history_dir: Path) -> list[tuple[str, dict]]:
    """(file name, results) of each readable history file, oldest first."""
    out = []
    for f in sorted(Path(history_dir).glob("*.json")) if Path(history_dir).is_dir() else []:
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "servers" in data and "created_at" in data:
            out.append((f.name, data))
    return sorted(out, key=lambda item: (item[1]["created_at"], item[0]))


def watch(current: dict, history: list[tuple[str, dict]], acceptance_tol_pct: float = 3.0,
          speed_tol_pct: float = 10.0) -> dict:
    """The verdict on `current` against the history (oldest first; not containing `current`).
    status: first | new baseline | stable | improved | regression."""
    base = {"acceptance_tolerance_pct": acceptance_tol_pct, "speed_tolerance_pct": speed_tol_pct,
            "figures": figures(current), "comparisons": [], "changes": [], "reference": None}
    same = [(n, r) for n, r in history if not _differences(IDENTITY, current, r)]
    good = [(n, r) for n, r in same if (r.get("watch") or {}).get("status") != "regression"]
    if not good:
        if not history:
            return {**base, "status": "first", "message": "no earlier result: this run is the first baseline"}
        name, prev = history[-1]
        changes = _differences(IDENTITY, current, prev) or ["every earlier run of this setup was a regression"]
        return {**base, "status": "new baseline", "reference": {"file": name, "created_at": prev["created_at"]},
                "changes": changes, "message": f"new baseline (not compared): {'; '.join(changes)} since {name}"}
    name, ref = good[-1]
    rows = compare(current, ref, acceptance_tol_pct, speed_tol_pct, between_runs_sd([r for _, r in good]))
    changes = _differences(ENVIRONMENT, current, ref)
    bad = [r for r in rows if r["verdict"] == "regression"]
    better = [r for r in rows if r["verdict"] == "improvement"]
    out = {**base, "reference": {"file": name, "created_at": ref["created_at"]}, "comparisons": rows,
           "changes": changes}
    what = "; ".join(changes) if changes else ("nothing recorded changed (engine version, config, driver, GPU, "
                                                "pack version): look at the node itself (other load, clocks)")
    if bad:
        shown = ", ".join(f"{r['where']} {r['figure']} {_num(r['reference'])} -> {_num(r['value'])} "
                          f"({r['change_pct']:+.1f} %)" for r in bad[:6])
        return {**out, "status": "regression",
                "message": f"regression against the last good run {name}: {shown}"
                           f"{' and more' if len(bad) > 6 else ''}. Changed since then: {what}"}
    if better:
        return {**out, "status": "improved", "message": f"{len(better)} figure(s) improved beyond the noise against "
                                                         f"{name}; changed since then: {what}"}
    unjudged = [r for r in rows if "not judged" in r["verdict"]]
    note = (f"; {len(unjudged)} speed figure(s) changed beyond the noise, reported, not judged on a CPU rehearsal"
            if unjudged else "")
    return {**out, "status": "stable", "message": f"{len(rows) - len(unjudged)} of {len(rows)} figures within the "
                                                 f"noise or the tolerance of {name}{note}"
                                                 + (f"; changed since then: {what}" if changes else "")}


def _num(v: float) -> str:
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def markdown(w: dict) -> list[str]:
    """The report's section on the watch: this run's figures with their intervals, then the comparison."""
    lines = ["", "**Figures with 95 % intervals** (see eagle3/bench/watch.py for how each is computed):", "",
             "| config | concurrency | output tok/s | mean TPOT ms | acceptance length | per position % |",
             "|---|---:|---|---|---|---|"]
    for f in sorted(w["figures"].values(), key=lambda f: (f["k"], f["concurrency"])):
        al = f.get("acceptance_length")
        per_pos = "/".join(f"{100 * p['value']:.0f}" + (f"±{50 * (p['hi'] - p['lo']):.0f}" if p["lo"] is not None
                                                          else "") for p in f.get("per_position", [])) or "—"
        lines.append(f"| {'k=' + str(f['k']) if f['k'] else 'baseline'} | {f['concurrency']} | "
                     f"{_ci_of(f['output_tok_s'])} | {_ci_of(f['mean_tpot_ms'])} | {_ci_of(al) if al else '—'} | "
                     f"{per_pos} |")
    lines += ["", f"**Compared with history** ({w['status']}): {w['message']}"]
    if w["comparisons"]:
        lines += ["", "| where | figure | now [95 % interval] | reference [95 % interval] | change | verdict |",
                  "|---|---|---|---|---:|---|"]
        for r in w["comparisons"]:
            lines.append(f"| {r['where']} | {r['figure']} | {_ci(r['value'], r['lo'], r['hi'])} | "
                         f"{_ci(r['reference'], r['reference_lo'], r['reference_hi'])} | "
                         f"{'—' if r['change_pct'] is None else format(r['change_pct'], '+.1f') + ' %'} | {r['verdict']} |")
    return lines


def _ci_of(f: dict) -> str:
    return "—" if f.get("value") is None else _ci(f["value"], f["lo"], f["hi"])


def _ci(v, lo, hi) -> str:
    return _num(v) + (f" [{_num(lo)}, {_num(hi)}]" if lo is not None and hi is not None else " [no interval]")
