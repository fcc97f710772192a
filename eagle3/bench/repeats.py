"""Intervals and verdicts from repeated windows, free of I/O.

One window is one load-generator run on one server at one concurrency. Its throughput moves between
windows and, more, between server starts (on the H200, two runs minutes apart differed by 22 %
while their acceptance was identical). So a speed figure is the mean over repeated windows
(bench.windows per server, bench.rounds server starts in A B A B order), its interval a Student t
interval over those windows, and a speedup the ratio of two such means with a Welch interval on the
log scale; with bench.schedule interleaved, where each window slot holds one window of every config
back to back, the ratio is taken slot by slot (paired), so drift common to a slot cancels. A
comparison is decided only when its interval excludes 1; otherwise it is undecided, and the verdict
says about how many more windows per side would likely decide it. Nothing is decided on one window:
one window has no spread to judge by.
"""

from __future__ import annotations

import math

# Two-sided 95 % Student t quantiles, by degrees of freedom (1..30); above 30 it is interpolated
# towards the normal 1.96.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]
FASTER, NOT_FASTER, UNDECIDED = "faster", "not faster", "undecided"


def t975(df: float) -> float:
    if df < 1:
        return math.inf
    if df <= 30:
        lo = int(math.floor(df))
        hi = min(30, lo + 1)
        return _T975[lo - 1] + (_T975[hi - 1] - _T975[lo - 1]) * (df - lo)
    return 1.96 + (2.042 - 1.96) * 30 / df


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    n = len(values)
    m = sum(values) / n
    return m, (math.sqrt(sum((x - m) ** 2 for x in values) / (n - 1)) if n > 1 else None)


def mean_interval(values: list[float]) -> dict:
    """{"value", "lo", "hi", "n", "method"}: the mean over windows and its 95 % t interval (none below 2)."""
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"value": None, "lo": None, "hi": None, "n": 0, "method": "no window"}
    m, sd = mean_sd(values)
    if sd is None:
        return {"value": m, "lo": None, "hi": None, "n": 1, "method": "one window: no spread to judge by"}
    half = t975(len(values) - 1) * sd / math.sqrt(len(values))
    return {"value": m, "lo": m - half, "hi": m + half, "n": len(values),
            "method": f"t interval over {len(values)} windows"}


def _log_terms(values: list[float]) -> tuple[float, float, int]:
    """(mean, variance of log(mean) by the delta method, n)."""
    m, sd = mean_sd(values)
    return m, (sd / m) ** 2 / len(values), len(values)


def ratio_interval(num: list[float], den: list[float]) -> dict:
    """mean(num) / mean(den) with a 95 % interval: Welch's t on the log of the ratio (delta method),
    so it is symmetric in relative terms and never crosses 0. Needs >= 2 windows on each side."""
    num = [float(v) for v in num if v is not None]
    den = [float(v) for v in den if v is not None]
    if not num or not den or not (sum(den) > 0 and sum(num) > 0):
        return {"value": None, "lo": None, "hi": None, "n": [len(num), len(den)], "df": None}
    mn, vn, nn = _log_terms(num) if len(num) > 1 else (sum(num) / len(num), None, len(num))
    md, vd, nd = _log_terms(den) if len(den) > 1 else (sum(den) / len(den), None, len(den))
    r = mn / md
    if vn is None or vd is None:
        return {"value": r, "lo": None, "hi": None, "n": [nn, nd], "df": None}
    var = vn + vd
    if var == 0:
        return {"value": r, "lo": r, "hi": r, "n": [nn, nd], "df": math.inf}
    df = var ** 2 / ((vn ** 2 / (nn - 1) if vn else 0) + (vd ** 2 / (nd - 1) if vd else 0))
    half = t975(df) * math.sqrt(var)
    return {"value": r, "lo": r * math.exp(-half), "hi": r * math.exp(half), "n": [nn, nd], "df": round(df, 2)}


def paired_ratio_interval(pairs: list[tuple[float, float]]) -> dict:
    """The ratio of two configs measured in the same window slots (bench.schedule interleaved: in each
    slot one window of each, back to back): the geometric mean of the slots' ratios, with a 95 % t
    interval over their logs. Drift that moves both windows of a slot alike cancels in that slot's
    ratio instead of widening both sides' spread. Needs >= 2 slots."""
    logs = [math.log(a / b) for a, b in pairs if a and b and a > 0 and b > 0]
    n = len(logs)
    if not n:
        return {"value": None, "lo": None, "hi": None, "n": [0, 0], "df": None, "method": "paired"}
    m, sd = mean_sd(logs)
    r = math.exp(m)
    if sd is None:
        return {"value": r, "lo": None, "hi": None, "n": [1, 1], "df": None, "method": "paired"}
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"value": r, "lo": r * math.exp(-half), "hi": r * math.exp(half), "n": [n, n], "df": n - 1,
            "method": "paired"}


def reach_pct(ratio: dict, around: float | None = None) -> float | None:
    """How far a ratio's 95 % interval reaches from `around` (default: its own value), in percent; None
    without an interval. Around its value: the interval's half-width, what the pack's "±" always means (a
    log-symmetric interval reaches equally far either side). Around 1 for an A/A check: where its interval
    ends, which bench.max_windows stops on (the twin within ±target of 1), never reported as a "±"."""
    if ratio.get("lo") is None or ratio.get("hi") is None:
        return None
    around = ratio["value"] if around is None else around
    return max(ratio["hi"] / around - 1, 1 - ratio["lo"] / around) * 100


def pair_by_slot(windows: list[dict], base: list[dict]) -> list[tuple[float, float]] | None:
    """(tok/s of `windows`, of `base`) per window slot both measured (bench.schedule interleaved), or
    None when a window carries no slot (sequential servers: nothing to pair)."""
    if not windows or not base or any("slot" not in w for w in windows + base):
        return None
    by_slot = {w["slot"]: w["load"]["output_throughput"] for w in base}
    return [(w["load"]["output_throughput"], by_slot[w["slot"]]) for w in windows if w["slot"] in by_slot]


def verdict(ratio: dict) -> dict:
    """faster (the interval lies above 1), not faster (below 1), or undecided, with why and, when
    undecided, about how many more windows per side would likely decide it at the same spread."""
    r, lo, hi = ratio.get("value"), ratio.get("lo"), ratio.get("hi")
    if r is None:
        return {"verdict": UNDECIDED, "why": "nothing measured", "more_windows": None}
    n = ratio.get("n") or [1, 1]
    if lo is None or hi is None:
        return {"verdict": UNDECIDED, "more_windows": max(0, 2 - min(n)) or 1,
                "why": f"{min(n)} window(s) on one side: no spread to judge by (bench.windows >= 2)"}
    if lo > 1:
        return {"verdict": FASTER, "why": f"95 % interval [{lo:.3f}, {hi:.3f}] above 1", "more_windows": 0}
    if hi < 1:
        return {"verdict": NOT_FASTER, "why": f"95 % interval [{lo:.3f}, {hi:.3f}] below 1", "more_windows": 0}
    half = (math.log(hi) - math.log(lo)) / 2
    distance = abs(math.log(r))
    if distance < 1e-9:
        more = None
        why = f"95 % interval [{lo:.3f}, {hi:.3f}] contains 1 and the estimate is 1: no number of windows decides it"
    else:
        # The half-width shrinks as 1/sqrt(n): n * (half / distance)^2 windows per side would decide it.
        need = math.ceil(min(n) * (half / distance) ** 2)
        more = max(1, need - min(n))
        why = (f"95 % interval [{lo:.3f}, {hi:.3f}] contains 1; about {more} more window(s) per side would "
               "likely decide it at this spread")
    return {"verdict": UNDECIDED, "why": why, "more_windows": more}


def rounds_agree(runs: list[dict]) -> dict:
    """The A/A check of a run with bench.rounds >= 2: per (k, concurrency), each later round's mean
    output tok/s against round 1's, with its interval. The same server measured again must show no
    change: status "agree" when every interval contains 1, "differ" when one excludes it (drift or
    server-start noise larger than the windows show), "undecided" without intervals (1 window)."""
    by_point: dict[tuple[int, int], dict[int, list[float]]] = {}
    for r in runs:
        if r.get("twin"):  # the in-round A/A server is judged by twin_agrees
            continue
        for w in r["windows"]:
            by_point.setdefault((r["k"], w["concurrency"]), {}).setdefault(r.get("round", 1), []).append(
                w["load"]["output_throughput"])
    rows = []
    for (k, c), rounds in sorted(by_point.items()):
        first = rounds.get(1)
        for n, values in sorted(rounds.items()):
            if n == 1 or not first:
                continue
            ratio = ratio_interval(values, first)
            same = None if ratio["lo"] is None else ratio["lo"] <= 1 <= ratio["hi"]
            rows.append({"k": k, "concurrency": c, "round": n, "ratio": _rounded(ratio["value"]),
                         "ci": None if ratio["lo"] is None else [_rounded(ratio["lo"]), _rounded(ratio["hi"])],
                         "agrees": same})
    if not rows:
        return {"status": "undecided", "rows": [], "message": "one round: nothing to compare"}
    differ = [r for r in rows if r["agrees"] is False]
    if differ:
        shown = ", ".join(f"{'k=' + str(r['k']) if r['k'] else 'baseline'} c={r['concurrency']} round {r['round']}: "
                          f"{r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" for r in differ)
        return {"status": "differ", "rows": rows, "message": f"the same server measured again moved beyond its "
                f"windows' noise ({shown}): drift or server-start noise; more rounds widen the intervals to match"}
    if any(r["agrees"] is None for r in rows):
        return {"status": "undecided", "rows": rows, "message": "rounds compared without intervals (1 window each)"}
    # "Agree" is only as sharp as its widest interval: on the H200 two windows a round gave [0.51, 1.65],
    # which a 20 % change passes too. Say how sharp, so no one reads it as "no change at all".
    resolution = max(max(r["ci"][1] / r["ratio"] - 1, 1 - r["ci"][0] / r["ratio"]) for r in rows) * 100
    return {"status": "agree", "rows": rows, "resolution_pct": round(resolution, 1),
            "message": f"every later round within the noise of round 1 ({len(rows)} comparisons): no change seen, "
                       f"but only a change beyond ±{resolution:.0f} % would have shown (the widest interval's "
                       "half-width); "
                       "more windows per round sharpen the check"}


def twin_agrees(runs: list[dict]) -> dict:
    """The A/A check of bench.aa_twin: a second baseline server measured in every window slot beside
    the baseline (schedule interleaved). Per concurrency, its tok/s over the baseline's, paired slot by
    slot: it must show no change ("agree", every interval contains 1; "differ" otherwise), and the
    widest interval's half-width (its "±") is the noise floor of a paired speedup on this machine."""
    twin = [w for r in runs if r.get("twin") for w in r["windows"]]
    base = [w for r in runs if not r["k"] and not r.get("twin") for w in r["windows"]]
    rows = []
    for c in sorted({w["concurrency"] for w in twin}):
        at = lambda windows: [w for w in windows if w["concurrency"] == c]  # noqa: E731
        ratio = paired_ratio_interval(pair_by_slot(at(twin), at(base)) or [])
        ci = None if ratio["lo"] is None else [_rounded(ratio["lo"]), _rounded(ratio["hi"])]
        rows.append({"concurrency": c, "slots": ratio["n"][0], "ratio": _rounded(ratio["value"]), "ci": ci,
                     "agrees": None if ci is None else ci[0] <= 1 <= ci[1],
                     "half_width_pct": None if ci is None else round(reach_pct(ratio), 2)})
    if not rows or any(r["agrees"] is None for r in rows):
        return {"status": "undecided", "rows": rows, "message": "the twin needs two window slots or more"}
    widest = max(r["half_width_pct"] for r in rows)
    shown = ", ".join(f"c={r['concurrency']}: {r['ratio']:.3f} [{r['ci'][0]:.3f}, {r['ci'][1]:.3f}]" for r in rows)
    if any(not r["agrees"] for r in rows):
        return {"status": "differ", "rows": rows, "noise_floor_pct": widest,
                "message": f"the same config on two servers at once differed beyond its paired interval ({shown}): "
                           "the two servers are not alike (placement, warm-up); no speedup here is to be trusted "
                           "to better than that"}
    return {"status": "agree", "rows": rows, "noise_floor_pct": widest,
            "message": f"the baseline's twin within the noise of the baseline ({shown}): a paired speedup here "
                       f"resolves changes beyond ±{widest:.1f} %"}


def _rounded(v: float | None) -> float | None:
    return None if v is None else round(v, 4)
