"""The benchmark watch: every result compared with its history (bench-history/*.json), so that a
scheduled rerun says when the drafter or the engine regressed, and never blames either for the node.

The figures, each with a 95 % interval from its run's own data, are eagle3/bench/figures.py's.

What is compared: the last good run (no decided regression) of the same setup, i.e. target (by its content
where both runs recorded its fingerprint, eagle3/bench/provenance.py), engine, prompts and sampling. The
drafter may change between them (a retrain, a re-export): that is what a rerun is scheduled to catch, and
its checksum is named when it did.

What is judged, against what noise, and what fails:
- The drafter, by what it controls. Its acceptance (length and each position) is judged against the
  rerun noise: the same prompts decoded greedily give the same counters on every rerun (to the last
  digit on the H200 and here), so a drop by more than acceptance_tolerance_pct is decided; with sampling,
  or where reruns did differ, the spread over the earlier runs widens it (and with sampling and no such
  runs yet, each run's own interval). Its paired speedup is judged against both runs' intervals and its
  spread over earlier runs; a lower speedup with the acceptance held is a slower speculative step, the
  engine's or the node's, and a drafter regression only when the drafter itself changed.
- Absolute throughput and TPOT, of every server, against the setup's usual level and between-run noise,
  learned from its history (the median and the spread of its earlier good runs, from min_noise_runs of
  them on; until then "not judged: between-run noise not yet known"). Beyond that noise and
  speed_tolerance_pct: an engine regression when
  the baseline is worse and an engine-side change is recorded (engine version, serving config: what the
  bench asks of its engine without paths or ports, driver, GPU, pack version), node drift when nothing
  recorded changed. A baseline that moved with the drafter's servers
  while the speedup held is node drift, named with the baseline's change, whatever the noise.
- Status, the worst of: drafter regression, engine regression, node drift, undecided (a drafter figure
  worse than its tolerance but within the noise), improved, stable. A drafter regression fails the bench
  phase (`eagle3 run` and every flow); an engine regression fails the scheduled rerun
  (flows/benchmark.py); undecided and drift are reported and never fail.
- What the noise allows: per figure, the smallest regression that would be decided (the noise, in
  percent), with the knob that tightens it (bench.windows).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from .figures import HIGHER_IS_BETTER, Z, figures

# What makes two results comparable (a difference: a new baseline) ...
IDENTITY = {
    "engine": lambda r: r["engine"],
    "prompts": lambda r: r["prompts"].get("sha256"),
    "sampling": lambda r: json.dumps(r["sampling"], sort_keys=True),
}
# ... and what may change between comparable runs; a verdict names those that did. The drafter first: a
# rerun exists to catch its regressions; the rest is the engine's side.
DRAFTER = {"drafter checksum": lambda r: r["drafter"].get("checksum") or r["drafter"]["path"]}
# A result from before results recorded their serving config (eagle3/bench/provenance.py) is not compared on
# it: the whole config's hash it has instead holds paths, and a checkout moved elsewhere is no engine change.
UNRECORDED = object()
ENGINE_SIDE = {
    "engine version": lambda r: r.get("engine_version"),
    "serving config": lambda r: r.get("serving_hash", UNRECORDED),
    "driver": lambda r: (r.get("platform") or {}).get("driver"),
    "GPU": lambda r: (r.get("platform") or {}).get("gpu_names"),
    "pack version": lambda r: r.get("pack_version"),
}
REGRESSIONS = ("drafter regression", "engine regression")
SEVERITY = ("stable", "improved", "undecided", "node drift", "engine regression", "drafter regression")
ABSOLUTE = ("output_tok_s", "mean_tpot_ms")


# ---- one figure -----------------------------------------------------------------------------------

def _se(f: dict) -> float:
    return 0.0 if f.get("lo") is None or f.get("hi") is None else (f["hi"] - f["lo"]) / (2 * Z)


def _row(where: dict, name: str, cur: dict, ref: dict, noise: float | None, tolerance_pct: float,
         verdict: str) -> dict:
    a, b = cur["value"], ref["value"]
    return {**where, "figure": name, "value": a, "lo": cur.get("lo"), "hi": cur.get("hi"), "reference": b,
            "reference_lo": ref.get("lo"), "reference_hi": ref.get("hi"),
            "change_pct": round((a - b) / b * 100, 2) if b else None, "noise": noise,
            # the smallest regression this comparison would decide, in percent: what the noise allows
            "detectable_pct": round(max(tolerance_pct, 100 * noise / abs(b)), 2) if noise is not None and b else None,
            "verdict": verdict}


def _verdict(name: str, a: float, b: float, noise: float | None, tolerance_pct: float) -> str:
    """regression / improvement when beyond both the noise and the tolerance; undecided when worse than the
    tolerance but within the noise; else within noise."""
    diff = a - b
    relative = abs(diff) / abs(b) * 100 if b else (0.0 if not diff else math.inf)
    worse = (diff < 0) == HIGHER_IS_BETTER[name.split("[")[0]] and diff != 0
    if relative <= tolerance_pct:
        return "within noise"
    if noise is not None and abs(diff) <= noise:
        return "undecided" if worse else "within noise"
    return "regression" if worse else "improvement"


def between_runs(earlier: list[dict]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """Per figure, its level over earlier good runs and what a rerun varies by beyond one run's own interval:
    (median, spread as a standard deviation from the median absolute deviation, 1.4826 x MAD, runs), so that
    a run the node slowed or sped up (node drift is a good run too) moves neither for the runs after it;
    from 2 runs on."""
    values: dict[tuple[str, str], list[float]] = {}
    for r in earlier:
        for key, f in _flat(figures(r)).items():
            if f.get("value") is not None:
                values.setdefault(key, []).append(f["value"])
    return {key: (_median(xs), 1.4826 * _median([abs(x - _median(xs)) for x in xs]), len(xs))
            for key, xs in values.items() if len(xs) >= 2}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def _flat(figs: dict[str, dict]) -> dict[tuple[str, str], dict]:
    out = {}
    for key, f in figs.items():
        for name in (*ABSOLUTE, "speedup", "acceptance_length"):
            if name in f:
                out[(key, name)] = f[name]
        for i, p in enumerate(f.get("per_position", [])):
            out[(key, f"per_position[{i}]")] = p
    return out


# ---- every figure -----------------------------------------------------------------------------------

def compare(cur: dict, ref: dict, earlier: list[dict], settings: dict, greedy: bool) -> list[dict]:
    """Every figure of `cur` that `ref` has too, with its verdict (see the module docstring). `earlier`: the
    good runs of the setup whose spread is the between-run noise; `settings`: the watch's tolerances."""
    fc, fr = figures(cur), figures(ref)
    history = between_runs(earlier)
    spread = {key: sd for key, (_, sd, _) in history.items()}
    noise_known = len(earlier) >= settings["min_noise_runs"]
    rows = []
    for key in sorted(fc.keys() & fr.keys(), key=lambda k: (fc[k]["k"], fc[k]["concurrency"])):
        a, b = fc[key], fr[key]
        where = {"where": f"k={a['k']} c={a['concurrency']}" if a["k"] else f"baseline c={a['concurrency']}",
                 "k": a["k"], "concurrency": a["concurrency"]}
        for name, x, y in [(n, a[n], b[n]) for n in ABSOLUTE]:
            if x.get("value") is None or y.get("value") is None:
                continue
            if not noise_known:
                rows.append(_row({**where, "kind": "absolute"}, name, x, y, None, settings["speed_tolerance_pct"],
                                 f"not judged: between-run noise not yet known ({len(earlier)} of "
                                 f"{settings['min_noise_runs']} runs)"))
                continue
            # Against the setup's usual level (the median of its earlier runs), not the last run alone: one
            # run the node sped up must not make the next, ordinary one look like a change.
            level, sd, n = history.get((key, name), (y["value"], 0.0, 1))
            # What reruns varied by, against a median of n (its variance ~ pi/2n), and this run's own interval:
            # a run whose windows disagree among themselves decides nothing by its mean alone.
            noise = Z * math.sqrt(sd ** 2 * (1 + 1.57 / n) + _se(x) ** 2)
            usual = {"value": level, "lo": None, "hi": None}
            rows.append(_row({**where, "kind": "absolute", "reference_is": f"median of {n} earlier runs"}, name, x,
                             usual, noise, settings["speed_tolerance_pct"],
                             _verdict(name, x["value"], level, noise, settings["speed_tolerance_pct"])))
        if not a["k"]:
            continue
        pairs = [("speedup", a.get("speedup"), b.get("speedup"), settings["speed_tolerance_pct"], "speedup")]
        if "acceptance_length" in a and "acceptance_length" in b:
            pairs.append(("acceptance_length", a["acceptance_length"], b["acceptance_length"],
                          settings["acceptance_tolerance_pct"], "acceptance"))
            pairs += [(f"per_position[{i}]", x, y, settings["acceptance_tolerance_pct"], "acceptance")
                      for i, (x, y) in enumerate(zip(a["per_position"], b["per_position"]))]
        for name, x, y, tol, what in pairs:
            if not x or not y or x.get("value") is None or y.get("value") is None:
                continue
            sd = spread.get((key, name), 0.0)
            if what == "speedup":  # paired inside each run: the two intervals, and what reruns varied by
                noise = Z * math.sqrt(_se(x) ** 2 + _se(y) ** 2 + 2 * sd ** 2)
            elif greedy or sd:  # the counters repeat on reruns: only what they were seen to vary by
                noise = Z * math.sqrt(2) * sd
            else:  # sampled, no reruns yet: each run's own interval
                noise = Z * math.sqrt(_se(x) ** 2 + _se(y) ** 2)
            rows.append(_row({**where, "kind": "drafter"}, name, x, y, noise, tol,
                             _verdict(name, x["value"], y["value"], noise, tol)))
    return rows


# ---- the verdict on a run -----------------------------------------------------------------------------

def _setup_differences(cur: dict, ref: dict) -> list[str]:
    """What makes `ref` another setup than `cur`: the IDENTITY fields, and the target, by its content where
    both runs recorded it (a checkout or mount moved elsewhere is the same target), else by its path."""
    a, b = ref["target"], cur["target"]
    by = "fingerprint" if a.get("fingerprint") and b.get("fingerprint") else "model"
    moved = [f"target {_short(a[by])} -> {_short(b[by])}"] if a[by] != b[by] else []
    return moved + _differences(IDENTITY, cur, ref)


def _differences(fields: dict, cur: dict, ref: dict) -> list[str]:
    out = []
    for name, get in fields.items():
        x, y = get(ref), get(cur)
        if x != y and UNRECORDED not in (x, y):
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


def _listed(rows: list[dict], limit: int = 6) -> str:
    shown = ", ".join(f"{r['where']} {r['figure']} {_num(r['reference'])} -> {_num(r['value'])} "
                      f"({r['change_pct']:+.1f} %)" for r in rows[:limit])
    return shown + (" and more" if len(rows) > limit else "")


def _judge(rows: list[dict], drafter_changed: bool, engine_changes: list[str]) -> tuple[str, list[dict]]:
    """The run's status and the rows that make it (module docstring: status, the worst of ...)."""
    bad = [r for r in rows if r["verdict"] == "regression"]
    drafter = [r for r in bad if r["kind"] == "drafter" and (r["figure"] != "speedup" or drafter_changed)]
    if drafter:
        return "drafter regression", drafter
    baseline_worse = [r for r in bad if r["kind"] == "absolute" and r["k"] == 0]
    slower_step = [r for r in bad if r["figure"] == "speedup"]  # the same drafter, acceptance held
    if engine_changes and (baseline_worse or slower_step):
        return "engine regression", baseline_worse + slower_step
    moved = [r for r in rows if r["kind"] == "absolute" and r["verdict"] in ("regression", "improvement")]
    if moved or slower_step:
        return "node drift", moved + slower_step
    # A speedup within its noise says nothing of a drafter that did not change (its acceptance held).
    undecided = [r for r in rows if r["verdict"] == "undecided" and r["kind"] == "drafter"
                 and (r["figure"] != "speedup" or drafter_changed)]
    if undecided:
        return "undecided", undecided
    better = [r for r in rows if r["verdict"] == "improvement"]
    return ("improved", better) if better else ("stable", [])


def _shared_shift(cur: dict, ref: dict, rows: list[dict]) -> list[str]:
    """The baseline's own change where it moved beyond both runs' intervals while every paired speedup held:
    the node moved every server alike."""
    if any(r["figure"] == "speedup" and r["verdict"] != "within noise" for r in rows):
        return []
    out = []
    fc, fr = figures(cur), figures(ref)
    for key, f in sorted(fc.items()):
        if f["k"] or key not in fr:
            continue
        x, y = f["output_tok_s"], fr[key]["output_tok_s"]
        if x.get("value") and y.get("value") and abs(x["value"] - y["value"]) > Z * math.hypot(_se(x), _se(y)):
            out.append(f"baseline c={f['concurrency']} output tok/s {_num(y['value'])} -> {_num(x['value'])} "
                       f"({(x['value'] - y['value']) / y['value'] * 100:+.1f} %)")
    return out


def watch(current: dict, history: list[tuple[str, dict]], acceptance_tol_pct: float = 3.0,
          speed_tol_pct: float = 5.0, min_noise_runs: int = 3) -> dict:
    """The verdict on `current` against the history (oldest first; not containing `current`)."""
    settings = {"acceptance_tolerance_pct": acceptance_tol_pct, "speed_tolerance_pct": speed_tol_pct,
                "min_noise_runs": min_noise_runs}
    base = {**settings, "figures": figures(current), "comparisons": [], "changes": [], "reference": None}
    same = [(n, r) for n, r in history if not _setup_differences(current, r)]
    good = [(n, r) for n, r in same if (r.get("watch") or {}).get("status") not in (*REGRESSIONS, "regression")]
    if not good:
        if not history:
            return {**base, "status": "first", "message": "no earlier result: this run is the first baseline"}
        name, prev = history[-1]
        changes = _setup_differences(current, prev) or ["every earlier run of this setup was a regression"]
        return {**base, "status": "new baseline", "reference": {"file": name, "created_at": prev["created_at"]},
                "changes": changes, "message": f"new baseline (not compared): {'; '.join(changes)} since {name}"}
    name, ref = good[-1]
    env = {**DRAFTER, **ENGINE_SIDE}
    earlier = [r for _, r in good if not _differences(env, ref, r)]  # reruns of the reference's own environment
    greedy = float(current["sampling"].get("temperature") or 0.0) == 0.0
    rows = compare(current, ref, earlier, settings, greedy)
    drafter_changes, engine_changes = _differences(DRAFTER, current, ref), _differences(ENGINE_SIDE, current, ref)
    status, why = _judge(rows, bool(drafter_changes), engine_changes)
    noise_known = len(earlier) >= min_noise_runs
    shift = _shared_shift(current, ref, rows) if not noise_known and status in ("stable", "improved", "undecided") else []
    if shift and status != "node drift":
        status = "node drift"
    changed = "; ".join(drafter_changes + engine_changes) or "nothing recorded (engine version, config, driver, GPU, pack version, drafter)"
    messages = {
        "drafter regression": f"drafter regression against the last good run {name}: {_listed(why)}. Changed since then: {changed}",
        "engine regression": f"engine regression against the last good run {name}: {_listed(why)} (the drafter's "
                             f"acceptance held). Changed since then: {changed}",
        "node drift": f"node drift against {name}, not the drafter ({_drift_why(shift, why)}): "
                      + ("; ".join(shift) if shift else _listed(why)) + f". Changed since then: {changed}",
        "undecided": f"undecided against {name}: {_listed(why)} worse than the tolerance, within the noise; more "
                     "windows (bench.windows) decide it",
        "improved": f"{len(why)} figure(s) improved beyond the noise against {name}; changed since then: {changed}",
        "stable": f"{len(rows)} figures within the noise or the tolerance of {name}"
                  + (f"; changed since then: {changed}" if drafter_changes or engine_changes else ""),
    }
    unjudged = [r for r in rows if r["verdict"].startswith("not judged")]
    note = (f"; {len(unjudged)} absolute speed figures not judged yet: between-run noise is known from "
            f"{min_noise_runs} earlier runs of this setup ({len(earlier)} so far)") if unjudged else ""
    return {**base, "reference": {"file": name, "created_at": ref["created_at"]}, "comparisons": rows,
            "changes": drafter_changes + engine_changes, "noise_runs": len(earlier), "status": status,
            "drift": shift, "message": messages[status] + note, "detectable": _detectable(rows)}


def _drift_why(shift: list[str], why: list[dict]) -> str:
    if shift:
        return "its acceptance and paired speedups held while every server moved"
    if any(r["figure"] == "speedup" for r in why):
        return "its acceptance held: the speculative step itself was slower or faster"
    return "its acceptance held; servers moved beyond what reruns of this setup varied by"


def _detectable(rows: list[dict]) -> list[dict]:
    """Per judged figure of the drafter, the smallest regression this run's comparison would decide."""
    return [{"where": r["where"], "figure": r["figure"], "detectable_pct": r["detectable_pct"]}
            for r in rows if r["kind"] == "drafter" and r["detectable_pct"] is not None
            and r["figure"] in ("speedup", "acceptance_length")]


def _num(v: float) -> str:
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"


def markdown(w: dict) -> list[str]:
    """The report's section on the watch: this run's figures with their intervals, then the comparison."""
    lines = ["", "**Figures with 95 % intervals** (see eagle3/bench/figures.py for how each is computed):", "",
             "| config | concurrency | output tok/s | mean TPOT ms | speedup | acceptance length | per position % |",
             "|---|---:|---|---|---|---|---|"]
    for f in sorted(w["figures"].values(), key=lambda f: (f["k"], f["concurrency"])):
        al, sp = f.get("acceptance_length"), f.get("speedup")
        per_pos = "/".join(f"{100 * p['value']:.0f}" + (f"±{50 * (p['hi'] - p['lo']):.0f}" if p["lo"] is not None
                                                          else "") for p in f.get("per_position", [])) or "—"
        lines.append(f"| {'k=' + str(f['k']) if f['k'] else 'baseline'} | {f['concurrency']} | "
                     f"{_ci_of(f['output_tok_s'])} | {_ci_of(f['mean_tpot_ms'])} | {_ci_of(sp) if sp else '—'} | "
                     f"{_ci_of(al) if al else '—'} | {per_pos} |")
    lines += ["", f"**Compared with history** ({w['status']}): {w['message']}"]
    if w.get("detectable"):
        lines += ["", "What the noise allows (the smallest regression this comparison decides; more `bench.windows` "
                  "narrow it): " + "; ".join(f"{d['where']} {d['figure']} {d['detectable_pct']:g} %"
                                             for d in w["detectable"])]
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
