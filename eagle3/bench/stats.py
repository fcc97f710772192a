"""Benchmark arithmetic, free of I/O: the results table, speedups, the best k per concurrency,
acceptance pooled per k, and the acceptance sanity gate.

Inputs are the JSON-ready server runs the bench phase records (see eagle3/phases/bench.py):
  {"label", "k" (0 = baseline), "windows": [{"concurrency", "load": {...}, "acceptance": {...} | None}],
   "pooled": {...} | None, ...}
"""

from __future__ import annotations

from ..engines.metrics import SpecCounters, acceptance
from ..engines.spec_decode import acceptance_source

# What makes a trained drafter's acceptance collapse (docs/FACTS.md §2, §7, §8 F4/F7).
LIKELY_CAUSES = [
    "weights dropped at load: the engine silently skipped tensors it did not recognise (SGLang drops "
    "`layers.0.*` of a speculators checkpoint and runs a random decoder layer; check the server log for "
    "unmatched names, or export the checkpoint to the engine's layout)",
    "wrong aux layers: the drafter is served with other target layers than it was trained on (off-by-one "
    "between the layer-input and layer-output conventions, or ids missing so the engine used its defaults); "
    "compare the drafter config's eagle_aux_hidden_state_layer_ids with the extraction manifest",
    "wrong algorithm flag: vLLM method must be \"eagle3\" (without it a path may select draft_model); "
    "SGLang needs --speculative-algorithm EAGLE3 (EAGLE with an EAGLE-3 drafter gives accept length 1.00)",
    "chat template mismatch: the training conversations were rendered with another template (or thinking "
    "mode) than the benchmark requests, so the drafter predicts text the target never produces",
]


# Why a drafter whose tokens are accepted is still slower than no speculation (docs/FACTS.md §8, F4).
SLOWER_CAUSES = [
    "low per-position acceptance (F4: ~15 % per draft token): each verify step pays for k draft tokens and "
    "keeps few; look at the per-position column and at the serve-parity gate, which separates a handover "
    "mismatch (vocabulary map, aux layers, export layout, chat template) from a weak drafter",
    "auxiliary hidden-state capture or an attention path (e.g. MLA) that makes the target's verify step slow "
    "with speculation: compare TPOT with and without the drafter at concurrency 1",
    "k too large for the acceptance: a smaller k drafts less that is thrown away (see the best k per concurrency)",
    "only high concurrencies measured: speculation pays least when the GPU is already busy; measure concurrency 1",
]


def _pool(windows: list[dict], engine: str) -> dict | None:
    """Acceptance over all measured windows of one server: summed counter deltas, formulas re-applied."""
    deltas = [SpecCounters.from_dict(w["delta"]) for w in windows if w.get("delta")]
    if not deltas:
        return None
    total = deltas[0]
    for d in deltas[1:]:
        total = total + d
    return acceptance(total, acceptance_source(engine)).to_dict()


def pooled_acceptance(run: dict, engine: str) -> dict | None:
    if run["k"] == 0:
        return None
    pooled = _pool(run["windows"], engine)
    final = run.get("accept_length_final")
    if pooled is None and engine == "sglang" and final is not None:  # a record from before SGLang's counters
        return {"acceptance_length": final, "acceptance_rate": None, "per_position": [],
                "source": "sglang /server_info avg_spec_accept_length at the end"}
    return pooled


def table(runs: list[dict]) -> list[dict]:
    """One flat row per (server, concurrency): the Prefect table and the report's table."""
    base = {w["concurrency"]: w["load"] for r in runs if r["k"] == 0 for w in r["windows"]}
    rows = []
    for r in runs:
        for w in r["windows"]:
            load, acc, b = w["load"], w.get("acceptance") or {}, base.get(w["concurrency"])
            speedup = (load["output_throughput"] / b["output_throughput"]
                       if b and r["k"] and b["output_throughput"] else None)
            tpot_ratio = (b["mean_tpot_ms"] / load["mean_tpot_ms"]
                          if b and r["k"] and b.get("mean_tpot_ms") and load.get("mean_tpot_ms") else None)
            rate = acc.get("acceptance_rate")
            rows.append({
                "config": r["label"], "k": r["k"], "concurrency": w["concurrency"],
                "output_tok_s": _r(load["output_throughput"]), "speedup": _r(speedup, 3),
                "mean_tpot_ms": _r(load.get("mean_tpot_ms")), "tpot_speedup": _r(tpot_ratio, 3),
                "mean_ttft_ms": _r(load.get("mean_ttft_ms")),
                "acceptance_rate_pct": _r(rate * 100 if rate is not None else None),
                "acceptance_length": _r(acc.get("acceptance_length"), 3),
                "per_position_pct": [_r(p * 100) for p in acc.get("per_position") or []],
                "completed": load["completed"], "failed": load["failed"],
            })
    return rows


def best_k(rows: list[dict]) -> dict[str, dict]:
    """Per concurrency, the k with the highest output tok/s ratio to the baseline (keys are strings
    so the mapping survives JSON). `beats_baseline` false: no k was faster than not speculating."""
    best: dict[str, dict] = {}
    for row in rows:
        if not row["k"] or row["speedup"] is None:
            continue
        key = str(row["concurrency"])
        if key not in best or row["speedup"] > best[key]["speedup"]:
            best[key] = {"k": row["k"], "speedup": row["speedup"], "output_tok_s": row["output_tok_s"],
                         "beats_baseline": row["speedup"] > 1.0}
    return dict(sorted(best.items(), key=lambda kv: int(kv[0])))


def speed_and_position_findings(pooled_by_k: dict[int, dict | None], best: dict[str, dict],
                                first_position_floor: float) -> list[str]:
    """What F4 looks like (docs/FACTS.md §8): no k faster than the baseline at any measured
    concurrency, or the first draft position rarely accepted (the mean length of the best k hides
    it: at 15 % per token, k=3 still gives ~1.45)."""
    findings = []
    if best and not any(b["beats_baseline"] for b in best.values()):
        shown = ", ".join(f"c={c}: best k={b['k']} at {b['speedup']:.2f}x" for c, b in best.items())
        findings.append(f"no k is faster than the baseline at any measured concurrency ({shown})")
    first = {k: p["per_position"][0] for k, p in pooled_by_k.items() if p and p.get("per_position")}
    if first and max(first.values()) < first_position_floor:
        shown = ", ".join(f"k={k}: {100 * v:.1f} %" for k, v in sorted(first.items()))
        findings.append(f"draft position 0 is accepted in under {100 * first_position_floor:.0f} % of drafts "
                        f"({shown}; bench.first_position_floor)")
    return findings


def evaluate_gate(pooled_by_k: dict[int, dict | None], trained: bool, floor: float, best: dict[str, dict] | None = None,
                  cpu_rehearsal: bool = False, first_position_floor: float = 0.0) -> dict:
    """The sanity gate. It judges the best acceptance length over k (it grows with k, so a sound
    drafter clears the floor at its largest k even if k=1 is close to it), then, for a trained
    drafter on GPUs, speed and per-position acceptance (speed_and_position_findings): either fails
    it. On a CPU rehearsal, where speculation cannot pay, those findings are reported, not failed.
    An untrained drafter is reported, never failed: its acceptance is expected to be near zero."""
    lengths = {k: (p or {}).get("acceptance_length") for k, p in pooled_by_k.items()}
    measured = {k: v for k, v in lengths.items() if v is not None}
    best_length = max(measured.values()) if measured else None
    findings = speed_and_position_findings(pooled_by_k, best or {}, first_position_floor) if trained else []
    gate = _length_gate(lengths, best_length, trained, floor)
    gate["findings"] = findings
    if findings and gate["status"] == "passed" and not cpu_rehearsal:
        gate.update(status="failed", passed=False, likely_causes=SLOWER_CAUSES + LIKELY_CAUSES,
                    message=f"trained drafter on GPUs: {'; '.join(findings)} (best acceptance length "
                            f"{best_length:.3f}, floor {floor})")
    elif findings and gate["status"] == "passed":
        gate["message"] += (f". Reported, not failed, on a CPU rehearsal (speculation cannot pay on CPU; on GPUs "
                            f"this fails): {'; '.join(findings)}")
    return gate


def _length_gate(lengths: dict, best: float | None, trained: bool, floor: float) -> dict:
    gate = {"floor": floor, "trained": trained, "acceptance_length_by_k": {str(k): v for k, v in lengths.items()},
            "best_acceptance_length": best, "likely_causes": []}
    if not trained:
        gate.update(status="reported", passed=None,
                    message=f"not applied: the drafter is an UNTRAINED rehearsal checkpoint (best acceptance length "
                            f"{_fmt(best)}; near 1.0 is expected). Its numbers measure the pipeline, not a drafter.")
    elif best is None:
        gate.update(status="failed", passed=False, likely_causes=LIKELY_CAUSES,
                    message="no acceptance was measured for any k: the server reported no speculative decoding "
                            "(spec-decode counters absent or zero drafts), so the drafter was not used")
    elif best < floor:
        gate.update(status="failed", passed=False, likely_causes=LIKELY_CAUSES,
                    message=f"trained drafter: best acceptance length {best:.3f} is below the floor {floor} "
                            f"(by k: {_by_k(lengths)})")
    else:
        gate.update(status="passed", passed=True,
                    message=f"best acceptance length {best:.3f} >= floor {floor} (by k: {_by_k(lengths)})")
    return gate


def gate_error_text(gate: dict, results_path: str) -> str:
    causes = "\n".join(f"  - {c}" for c in gate["likely_causes"])
    return f"acceptance gate failed: {gate['message']}.\nLikely causes:\n{causes}\nAll numbers: {results_path}"


def _by_k(lengths: dict) -> str:
    return ", ".join(f"k={k}: {_fmt(v)}" for k, v in sorted(lengths.items()))


def _fmt(v) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _r(v, nd: int = 2):
    return None if v is None else round(float(v), nd)
