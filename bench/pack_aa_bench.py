"""The pack's own A/A check, schedule against schedule: the benchmark phase (`eagle3 run --only bench`)
on the CPU demo's real target (SmolLM2-135M-Instruct) with `bench.aa_twin`, once per schedule in
--schedules, repeated --reps times in rotating order, every other setting the same. What it compares is
the twin's paired interval (twin / baseline tok/s, slot by slot): the noise floor a speedup of that
schedule resolves. bench/alternation_probe.py measured the two designs with a client of its own; this
measures them through the phase a user runs.

The drafter is a random one (its speed is beside the point: only the baseline and its twin are
compared), served at k=1 beside them, so three servers share the machine as in a real round.

    .venv/bin/python bench/pack_aa_bench.py --out bench/results/pack-aa-cpu-DATE.json
    .venv/bin/python bench/pack_aa_bench.py --smoke   # CI: each schedule's config validated; no server started
    .venv/bin/python bench/pack_aa_bench.py --idle bench/results/pack-aa-cpu-DATE/results-*.json
        # each request's TTFT by how long its server had been idle before it (every request is in results.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from derive_profile import derive  # noqa: E402
from eagle3.fsio import atomic_write_json  # noqa: E402

BASE = REPO / "configs" / "smollm2-cpu.yaml"


def config_for(schedule: str, drafter: Path, args) -> Path:
    """The demo's config with the benchmark set for an A/A check under `schedule`, derived beside BASE
    (bench/derive_profile.py: validated, written atomically, its relative paths kept)."""
    sets = {"drafter": json.dumps(str(drafter.resolve())), "drafter_trained": "false", "num_speculative_tokens": "[1]",
            "concurrency": f"[{args.concurrency}]", "windows": args.windows, "num_prompts": args.prompts,
            "max_tokens": args.max_tokens, "ignore_eos": "true", "warmup_prompts": 2, "schedule": schedule,
            "aa_twin": "true", "parity": "{enabled: false}", "watch": "{enabled: false}"}
    return derive(BASE, f"smollm2-cpu-pack-aa-{schedule}", [f"bench.{k}={v}" for k, v in sets.items()])


def run_once(schedule: str, drafter: Path, args, keep: Path | None, rep: int) -> dict:
    config = config_for(schedule, drafter, args)
    run_dir = REPO / "runs" / f"smollm2-cpu-pack-aa-{schedule}"
    shutil.rmtree(run_dir / "bench", ignore_errors=True)  # a fresh measurement every time
    t0 = time.monotonic()
    rc = subprocess.call([str(REPO / ".venv" / "bin" / "eagle3"), "run", str(config), "--only", "bench",
                          "--force", "bench"], cwd=REPO)
    wall = time.monotonic() - t0
    results_path = run_dir / "bench" / "results.json"
    if not results_path.is_file():
        return {"schedule": schedule, "rep": rep, "exit": rc, "wall_s": round(wall, 1), "twin": None}
    results = json.loads(results_path.read_text())
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(results_path, keep / f"results-{schedule}-rep{rep}.json")
    twin = results.get("aa_twin") or {}
    row = (twin.get("rows") or [{}])[0]
    print(f"{schedule} rep {rep}: twin/baseline {row.get('ratio')} {row.get('ci')} "
          f"±{row.get('half_width_pct')} % ({twin.get('status')}), {wall:.0f} s", flush=True)
    return {"schedule": schedule, "rep": rep, "exit": rc, "wall_s": round(wall, 1), "twin": twin,
            "engine_version": results.get("engine_version")}


IDLE_BINS = ((0, 0.5), (0.5, 1), (1, 1.5), (1.5, 2), (2, 3), (3, 10), (10, float("inf")))


def ttft_by_idle(results: dict, slow_ms: float = 500) -> list[dict]:
    """Every measured request of a bench results.json, binned by how long its server had been idle
    since its own previous request ended: the median TTFT and the share above slow_ms per bin. The
    first request of each server has no idle time and is left out, and so is every request without
    its start time (vLLM's load generator, schedule interleaved, gives none: only the pack's client does)."""
    rows = []
    for server in results["servers"]:
        requests = sorted((q for w in server["windows"] for q in w["load"]["requests"] if "started_at" in q),
                          key=lambda q: q["started_at"])
        for prev, q in zip(requests, requests[1:]):
            rows.append((q["started_at"] - (prev["started_at"] + prev["latency_ms"] / 1000), q["ttft_ms"]))
    out = []
    for lo, hi in IDLE_BINS:
        ttft = [t for idle, t in rows if lo <= idle < hi]
        if ttft:
            out.append({"idle_s": [lo, hi if hi != float("inf") else None], "n": len(ttft),
                        "median_ttft_ms": round(statistics.median(ttft), 1),
                        "share_slow": round(sum(t > slow_ms for t in ttft) / len(ttft), 2)})
    return out


def summary(runs: list[dict], schedules: list[str]) -> dict:
    out = {}
    for s in schedules:
        widths = [r["twin"]["rows"][0]["half_width_pct"] for r in runs
                  if r["schedule"] == s and r["twin"] and r["twin"].get("rows")
                  and r["twin"]["rows"][0].get("half_width_pct") is not None]
        out[s] = {"half_width_pct": widths, "median_half_width_pct": round(statistics.median(widths), 2) if widths else None,
                  "agree": [r["twin"]["status"] for r in runs if r["schedule"] == s and r["twin"]],
                  "wall_s": [r["wall_s"] for r in runs if r["schedule"] == s]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", nargs="+", default=["interleaved", "alternating"],
                    choices=["interleaved", "alternating"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--windows", type=int, default=8, help="window slots per run")
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per window")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="validate each schedule's config (`eagle3 validate`) and stop")
    ap.add_argument("--idle", type=Path, nargs="+", help="results.json files: print TTFT by idle time, measure nothing")
    args = ap.parse_args()
    if args.idle:
        for path in args.idle:
            rows = ttft_by_idle(json.loads(path.read_text()))
            if not rows:
                print(f"{path.name}: no request carries its start time (the load generator's windows)")
            for row in rows:
                print(f"{path.name}: idle {row['idle_s'][0]}-{row['idle_s'][1] or 'more'} s: n={row['n']}, "
                      f"median TTFT {row['median_ttft_ms']} ms, share over 500 ms {row['share_slow']}")
        return 0
    if args.smoke:
        drafter = REPO / "tests" / "fixtures" / "eagle3-tiny" / "drafter-trained"  # any dir: only validated
        configs = [config_for(s, drafter, args) for s in args.schedules]
        for path in configs:
            subprocess.run([str(REPO / ".venv" / "bin" / "eagle3"), "validate", str(path)], check=True)
            print(f"{path.name}: valid")
        return 0

    from eagle3.drafters.testmaker import DrafterSpec, ensure_drafter
    from eagle3.tinymodel import default_engine

    target = REPO / "models" / "smollm2-135m"
    if not (target / "config.json").is_file():
        print(f"no target at {target}: run `make real-model` first", file=sys.stderr)
        return 2
    drafter = ensure_drafter(REPO / "models" / "smollm2-drafter-random", target, default_engine(), DrafterSpec())
    keep = args.out.with_suffix("") if args.out else None
    runs = []
    for rep in range(args.reps):
        order = args.schedules[rep % len(args.schedules):] + args.schedules[:rep % len(args.schedules)]
        for schedule in order:
            runs.append(run_once(schedule, drafter, args, keep, rep + 1))
    result = summary(runs, args.schedules)
    for s, row in result.items():
        print(f"{s}: twin half-width {row['half_width_pct']} %, median {row['median_half_width_pct']} %; "
              f"phase wall {row['wall_s']} s")
    if args.out:
        atomic_write_json(args.out, {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
            "cpus": os.cpu_count(), "target": "real weights: SmolLM2-135M-Instruct (models/smollm2-135m)",
            "drafter": "random (models/smollm2-drafter-random), k=1: not compared",
            "prompts": "held out (configs/prompts/generated/heldout.jsonl)",
            "settings": {"windows": args.windows, "prompts_per_window": args.prompts, "max_tokens": args.max_tokens,
                         "ignore_eos": True, "concurrency": args.concurrency, "reps": args.reps},
            "runs": runs, "summary": result})
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
