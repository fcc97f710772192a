"""The trend over a run dir's benchmark history (bench-history/*.json): acceptance length and
speedup per k, one row per run, as a markdown table with each run's watch verdict beside its figures.
Rendered from the history files alone, so it can be regenerated at any time (`trend_rows` + `markdown`)."""

from __future__ import annotations

from pathlib import Path

from .watch import read_history
from ..fsio import atomic_write_text


def trend_rows(history: list[tuple[str, dict]]) -> list[dict]:
    """One row per (run, k): pooled acceptance length, first-position rate, and the speedup over
    the baseline at each concurrency (output tok/s ratio)."""
    rows = []
    for n, (name, r) in enumerate(history, start=1):
        by_k = r.get("acceptance_by_k") or {}
        for k in r.get("num_speculative_tokens") or sorted(int(x) for x in by_k):
            acc = by_k.get(str(k)) or {}
            speedups = {str(t["concurrency"]): t["speedup"] for t in r.get("table", []) if t["k"] == k}
            rows.append({"run": n, "file": name, "created_at": r["created_at"],
                         "engine_version": r.get("engine_version"),
                         "drafter": (r["drafter"].get("checksum") or "")[:12] or r["drafter"]["path"],
                         "k": k, "acceptance_length": acc.get("acceptance_length"),
                         "first_position": (acc.get("per_position") or [None])[0], "speedup": speedups,
                         "watch": (r.get("watch") or {}).get("status", "—")})
    return rows


def markdown(rows: list[dict]) -> str:
    if not rows:
        return "# Benchmark trend\n\n(no history yet)\n"
    cs = sorted({c for r in rows for c in r["speedup"]}, key=int)
    head = " | ".join(f"speedup c={c}" for c in cs)
    lines = ["# Benchmark trend", "", f"{len({r['run'] for r in rows})} runs; acceptance length pooled over the "
             "concurrencies of each run; speedup = output tok/s against the baseline at the same concurrency.", "",
             f"| run | time (UTC) | engine | drafter | k | acceptance length | position 0 % | {head} | watch |",
             "|---:|---|---|---|---:|---:|---:|" + "---:|" * len(cs) + "---|"]
    for r in rows:
        al, p0 = r["acceptance_length"], r["first_position"]
        speed = " | ".join("—" if r["speedup"].get(c) is None else f"{r['speedup'][c]:.2f}×" for c in cs)
        lines.append(f"| {r['run']} | {r['created_at'][:19]} | {r['engine_version']} | `{r['drafter']}` | {r['k']} | "
                     f"{'—' if al is None else f'{al:.3f}'} | {'—' if p0 is None else f'{100 * p0:.1f}'} | {speed} | "
                     f"{r['watch']} |")
    return "\n".join(lines) + "\n"


def write_trend(history_dir: Path, md_path: Path) -> list[dict]:
    rows = trend_rows(read_history(history_dir))
    atomic_write_text(md_path, markdown(rows))
    return rows
