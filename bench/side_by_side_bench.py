"""An interleaved benchmark round's server starts: side by side (bench.start_servers: side_by_side, the
baseline's twin once the baseline is ready) against one by one, alternating, on real servers.

Each measured round runs the bench phase on the tiny CPU config with the baseline, k=1 and the baseline's
twin (the constant tiny drafter), one window slot of 4 short requests, and records the phase's
`round_starts`: the time from the round's first launch to its last server ready. One unrecorded round
first fills the compile cache, so every recorded start reuses it, in both modes alike.

    .venv/bin/python bench/side_by_side_bench.py --rounds 3 --out bench/results/side-by-side-cpu-DATE.json
    .venv/bin/python bench/side_by_side_bench.py --smoke     # CI: one round of each, no twin; not a measurement
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.engines.probe import inspect_engine  # noqa: E402
from eagle3.fsio import atomic_write_json  # noqa: E402
from eagle3.phases.bench import run_bench  # noqa: E402
from eagle3.phase_runner import supervisor  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402
from tests.ports import free_port  # noqa: E402

MODES = ("one_by_one", "side_by_side")


def one_round(root: Path, mode: str, target: Path, drafter: Path, twin: bool = True) -> dict:
    """The bench phase once with `mode`; its round_starts row and each server's own start time. `twin`:
    the baseline's twin as a third server (the smoke leaves it out: two starts fewer a round, on 2 cores)."""
    port = free_port((0, 1, 2))  # the baseline's, k=1's and the twin's
    cfg = write_tiny_config(root, {"target": {"model": str(target)}, "bench": {
        "server": {"port": port}, "drafter": str(drafter), "drafter_trained": True, "num_speculative_tokens": [1],
        "concurrency": [1], "num_prompts": 4, "max_tokens": 16, "warmup_prompts": 1, "windows": 1,
        "schedule": "interleaved", "aa_twin": twin, "start_servers": mode, "parity": {"enabled": False},
        "watch": {"enabled": False}}})
    sup = supervisor(cfg)
    inspect_engine(cfg, sup, "vllm")  # as the preflight does: the probed versions key the compile cache
    run_bench(cfg, sup)
    results = json.loads((cfg.phase_dir("bench") / "results.json").read_text())
    [starts] = results["round_starts"]
    return {**starts, "servers_s": {s["label"]: s["startup_s"] for s in results["servers"]}}


def main() -> int:
    from eagle3.drafters.testmaker import DrafterSpec, ensure_drafter
    from eagle3.tinymodel import TinyModelSpec, default_engine, ensure_tiny_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="one round of each, no twin (CI): not a measurement")
    args = ap.parse_args()
    target = ensure_tiny_model(REPO / "models" / "tiny-llama-constant", spec=TinyModelSpec(constant=True))
    drafter = ensure_drafter(REPO / "models" / "tiny-drafter-constant", target, default_engine(),
                             DrafterSpec(constant=True))
    rows = []
    with tempfile.TemporaryDirectory(prefix="eagle3-side-by-side-") as tmp:
        if not args.smoke:
            one_round(Path(tmp) / "warm", "side_by_side", target, drafter)  # fills the compile cache
        for n in range(1 if args.smoke else args.rounds):
            order = MODES if n % 2 == 0 else tuple(reversed(MODES))  # alternating: drift hits both alike
            for mode in order:
                row = {**one_round(Path(tmp) / f"r{n}-{mode}", mode, target, drafter, twin=not args.smoke),
                       "round": n + 1, "mode": mode}
                rows.append(row)
                print(f"round {n + 1} {mode:>12}: last ready {row['first_launch_to_last_ready_s']:6.1f} s after the "
                      f"first launch (starts summed {row['sum_of_starts_s']:.1f} s)", flush=True)
    wall = {m: [r["first_launch_to_last_ready_s"] for r in rows if r["mode"] == m] for m in MODES}
    ratios = [s / o for s, o in zip(wall["side_by_side"], wall["one_by_one"])]
    summary = {m: statistics.median(v) for m, v in wall.items()}
    print(f"median: side by side {summary['side_by_side']:.1f} s, one by one {summary['one_by_one']:.1f} s; "
          f"ratio per round {', '.join(f'{r:.3f}' for r in ratios)}")
    if args.out:
        atomic_write_json(args.out, {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
            "cpus": os.cpu_count(), "python": sys.version.split()[0], "smoke": args.smoke,
            "what": "tiny random-weight target (models/tiny-llama-constant), vLLM CPU build, baseline + k=1 + twin",
            "rows": rows, "median_s": summary, "ratio_per_round": ratios})
    return 0


if __name__ == "__main__":
    sys.exit(main())
