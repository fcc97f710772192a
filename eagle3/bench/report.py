"""The benchmark's human output: a markdown summary. No plot: its tables carry each speedup with its
interval, which a plot of points would drop.

Rendered from the results JSON alone, so a report can be regenerated from any file in bench-history/.
"""

from __future__ import annotations

from pathlib import Path

from .gates import markdown as gates_markdown
from .watch import markdown as watch_markdown
from ..fsio import atomic_write_text


def _f(v, nd: int = 2, suffix: str = "") -> str:
    return "—" if v is None else f"{v:.{nd}f}{suffix}"


def markdown(results: dict) -> str:
    d, p, s, gate = results["drafter"], results["prompts"], results["sampling"], results["gate"]
    trained = (d.get("status") or "trained") if d["trained"] else \
        "**UNTRAINED rehearsal checkpoint** (numbers measure the pipeline only)"
    own = results.get("run_drafter")  # this run's own training output, when bench.drafter serves another
    lines = [
        f"# Speculative-decoding benchmark: {results['pipeline']}",
        "",
        f"- run: {results['created_at']} (UTC), config hash `{results['config_hash']}` "
        f"(bench section `{results['bench_config_hash']}`)",
        f"- engine: {results['engine']} {results['engine_version']}, load from `{results['bench_client']}`",
        f"- target: `{results['target']['model']}` served as `{results['target']['served_name']}`",
        f"- drafter: `{d['path']}` — {trained}; aux layers {d.get('aux_layer_ids')} ({d.get('source')}); "
        f"checksum `{(d.get('checksum') or '?')[:16]}`",
        "- rows: `baseline` serves the target alone; each `k=N` row serves it with this drafter proposing N tokens",
        *([f"- this run's train phase wrote `{own['checkpoint']}` ({own['status']}); the benchmark serves bench.drafter "
           "instead"] if own else []),
        f"- prompts: {p['count']} from `{p['path']}` ({p['selection']}); temperature {s['temperature']}, "
        f"max tokens {s['max_tokens']}, ignore_eos {s['ignore_eos']}; {s['warmup_prompts']} warm-up requests "
        "per server, outside the measured windows",
        f"- acceptance: {results['acceptance_source']}",
        "",
        f"- repeats: {results.get('windows', 1)} window(s) per server and concurrency, {results.get('rounds', 1)} "
        "round(s) of server starts; each figure is the mean over its windows, [95 % interval] over them"
        + ("; every server of a round ran at once and their windows took turns (schedule interleaved): each "
           "speedup is paired slot by slot" if results.get("schedule") == "interleaved" else "")
        + ("; every server of a round ran at once and within each slot they took turns request by request "
           "(schedule alternating), the pack's streaming client sending the requests: each speedup is paired "
           "slot by slot" if results.get("schedule") == "alternating" else "")
        + (f"; with max_windows {results['max_windows']}, slots went on past these until every speedup was decided "
           f"or within ±{results['target_halfwidth_pct']:g} % and the twin within it (the windows column says how "
           "many each point got)" if results.get("max_windows") else ""),
        *[f"- server starts, round {r['round']}: {r['servers']} servers {r['start']}, the last ready "
          f"{r['first_launch_to_last_ready_s']:.1f} s after the first launch; their own start times sum to "
          f"{r['sum_of_starts_s']:.1f} s" for r in results.get("round_starts") or []],
        "",
        "| config | concurrency | output tok/s | speedup | speedup [95 %] | verdict | mean TPOT ms | TPOT speedup | "
        "acceptance % | acceptance length | per position % | windows | failed |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for row in results["table"]:
        per_pos = "/".join(_f(x, 0) for x in row["per_position_pct"]) or "—"
        ci = row.get("speedup_ci")
        lines.append(f"| {row['config']} | {row['concurrency']} | {_f(row['output_tok_s'], 1)} | "
                     f"{_f(row['speedup'], 2, '×')} | {f'[{ci[0]:.2f}, {ci[1]:.2f}]' if ci else '—'} | "
                     f"{row.get('verdict') or '—'} | {_f(row['mean_tpot_ms'])} | {_f(row['tpot_speedup'], 2, '×')} | "
                     f"{_f(row['acceptance_rate_pct'], 1)} | {_f(row['acceptance_length'])} | {per_pos} | "
                     f"{row.get('windows', 1)} | {row['failed']} |")
    lines += ["", "**Best k per concurrency** (output tok/s vs the baseline at the same concurrency; decided only "
                  "when the interval of the ratio excludes 1):", ""]
    why = {(r["k"], str(r["concurrency"])): r.get("verdict_why") for r in results["table"]}
    for c, b in results["best_k"].items():
        decided = b.get("verdict") or ("faster" if b["beats_baseline"] else "not faster")
        ci = b.get("speedup_ci")
        shown = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
        text = {"faster": "faster than no speculation", "not faster": "slower than no speculation"}.get(
            decided, f"undecided: {why.get((b['k'], c)) or 'no interval'}")
        lines.append(f"- concurrency {c}: k={b['k']} ({b['speedup']:.2f}×){shown} — {text}")
    if not results["best_k"]:
        lines.append("- (no speculative run to compare)")
    costs = [r for r in results["table"] if r.get("step_cost")]
    if costs:
        lines += ["", "**Step cost** (one speculative step's time in plain decode steps: TPOT × acceptance length ÷ "
                      "the baseline's TPOT; a speedup s needs an acceptance length of s × that cost):", ""]
        lines += [f"- k={r['k']}, concurrency {r['concurrency']}: a step costs {r['step_cost']:.2f} plain steps; 1.3× "
                  f"needs acceptance length {r['length_needed']:.2f} (measured {r['acceptance_length']:.2f}, at most "
                  f"{r['k'] + 1})" for r in costs]
    lines += ["", f"**Acceptance gate** ({gate['status']}): {gate['message']}"]
    if gate["likely_causes"]:
        lines += ["", "Likely causes:", *[f"- {c}" for c in gate["likely_causes"]]]
    lines += aa_markdown(results)
    lines += gates_markdown(results.get("parity"), results.get("categories") or [])
    if results.get("watch"):
        lines += watch_markdown(results["watch"])
    for note in results.get("notes", []):
        lines += ["", f"Note: {note}"]
    return "\n".join(lines) + "\n"


def aa_markdown(results: dict) -> list[str]:
    """The A/A checks: rounds against round 1 (bench.rounds), the baseline's twin (bench.aa_twin)."""
    lines: list[str] = []
    if results.get("aa"):
        aa = results["aa"]
        lines += ["", f"**A/A check** ({aa['status']}): {aa['message']}"]
        if aa["rows"]:
            lines += ["", "| config | concurrency | round | tok/s vs round 1 [95 %] | agrees |", "|---|---:|---:|---|---|"]
            lines += [f"| {'k=' + str(r['k']) if r['k'] else 'baseline'} | {r['concurrency']} | {r['round']} | "
                      f"{_compared(r)} |" for r in aa["rows"]]
    if results.get("aa_twin"):
        twin = results["aa_twin"]
        lines += ["", f"**A/A check, the baseline's twin** ({twin['status']}): {twin['message']}"]
        if twin["rows"]:
            lines += ["", "| concurrency | slots | twin / baseline, paired [95 %] | agrees |", "|---:|---:|---|---|"]
            lines += [f"| {r['concurrency']} | {r['slots']} | {_compared(r)} |" for r in twin["rows"]]
    return lines


def _compared(row: dict) -> str:
    """An A/A row's ratio [interval] | whether it agrees."""
    ci = f" [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}]" if row["ci"] else " [no interval]"
    return f"{row['ratio']:.3f}{ci} | {'—' if row['agrees'] is None else ('yes' if row['agrees'] else 'no')}"


def write_report(results: dict, report_path: Path) -> None:
    atomic_write_text(report_path, markdown(results))
