"""A drafter's acceptance on held-out prompts at each k, measured on this machine's vLLM: the real
target (SmolLM2-135M-Instruct, `eagle3 make-model smollm2`), the benchmark phase of the CPU demo's config
(`eagle3 run --only bench`), served with the drafter you give at each k in --ks.

Acceptance does not depend on how fast the machine is (greedy drafting and verification), so a CPU
measures what a GPU would, up to the two builds' numerics: each k is served and measured on its own, since
a step's start depends on how much the step before accepted (a larger k's first positions are not the
smaller k's: on 2026-12-05 k=5's first three summed to 2.50 where k=3 measured 2.59). Speed figures from
this script say nothing about a GPU and are not reported.

    .venv/bin/python bench/drafter_acceptance.py --pieces .carry/drafter-run4 \\
        --drafter-config bench/results/smollm2-h200-20261204-run4/drafter/config.json \\
        --ks 1 2 3 4 5 --out bench/results/drafter-acceptance-cpu-DATE.json
    .venv/bin/python bench/drafter_acceptance.py --drafter DIR --ks 3
    .venv/bin/python bench/drafter_acceptance.py --smoke   # CI: a random drafter, k=1, 4 prompts; not a measurement
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


from eagle3.fsio import atomic_write_json  # noqa: E402
from eagle3.safe_yaml import dump as dump_yaml, load as load_yaml  # noqa: E402
from tests.ports import free_port  # noqa: E402

BASE = REPO / "configs" / "smollm2-cpu.yaml"
CONFIG = REPO / "configs" / ".smollm2-cpu-drafter-acceptance.yaml"  # beside BASE: its relative paths hold


def assemble(pieces: Path, config: Path, into: Path) -> Path:
    """A drafter dir from the pieces of its model.safetensors (bench/gpu_e2e.sh drafter-out) and its config."""
    into.mkdir(parents=True, exist_ok=True)
    with open(into / "model.safetensors", "wb") as out:
        for part in sorted(pieces.glob("d.part*")):
            out.write(part.read_bytes())
    shutil.copy(config, into / "config.json")
    provenance = config.parent / "eagle3-provenance.json"
    if provenance.is_file():
        shutil.copy(provenance, into / provenance.name)
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", type=Path, help="a drafter checkpoint dir")
    ap.add_argument("--pieces", type=Path, help="a dir of d.part* pieces of a drafter's model.safetensors")
    ap.add_argument("--drafter-config", type=Path, help="with --pieces: the drafter's config.json")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--prompts", type=int, default=48, help="held-out prompts per window")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="a random drafter, k=1, 4 short prompts (CI): not a measurement")
    args = ap.parse_args()
    if args.smoke:
        from eagle3.drafters.testmaker import DrafterSpec, ensure_drafter
        from eagle3.tinymodel import default_engine

        target = REPO / "models" / "smollm2-135m"
        args.drafter = ensure_drafter(REPO / "models" / "smollm2-drafter-random", target, default_engine(), DrafterSpec())
        args.ks, args.prompts, args.max_tokens, args.concurrency, args.out = [1], 4, 16, 2, None
    drafter = args.drafter or assemble(args.pieces, args.drafter_config, REPO / "runs" / "carried-drafter")
    raw = load_yaml(BASE.read_text(), str(BASE))
    raw.update(name="smollm2-cpu-drafter-acceptance", run_dir="../runs/smollm2-cpu-drafter-acceptance")
    raw["target"]["max_model_len"] = 2048  # the GPU profile's
    # A random drafter (--smoke) would fail the acceptance gate: reported as untrained instead.
    raw["bench"].update(drafter=str(drafter.resolve()), drafter_trained=not args.smoke,
                        num_speculative_tokens=sorted(args.ks), concurrency=[args.concurrency], windows=1,
                        num_prompts=args.prompts,
                        max_tokens=args.max_tokens, warmup_prompts=2, parity={"enabled": False},
                        watch={"enabled": False})
    # Ports nobody else on the box draws from, not the profile's own: `make demo` serves those, and the
    # handoff rightly refuses to start beside a server it did not start (a newcomer's make test and make
    # demo side by side, 2026-12-06).
    base = free_port(tuple(range(3 + len(args.ks) + 1)))  # datagen, extract, then the bench's servers
    for i, section in enumerate(("datagen", "extract", "bench")):
        raw[section]["server"]["port"] = base + i
    CONFIG.write_text(dump_yaml(raw))
    run_dir = REPO / "runs" / "smollm2-cpu-drafter-acceptance"
    shutil.rmtree(run_dir / "bench", ignore_errors=True)  # a fresh measurement every time
    rc = subprocess.call([str(REPO / ".venv" / "bin" / "eagle3"), "run", str(CONFIG), "--only", "bench", "--force",
                          "bench"], cwd=REPO)
    results_path = run_dir / "bench" / "results.json"
    if not results_path.is_file():
        print(f"the bench phase wrote no results (exit {rc})", file=sys.stderr)
        return rc or 1
    results = json.loads(results_path.read_text())
    by_k = results["acceptance_by_k"]
    for k, a in sorted(by_k.items(), key=lambda kv: int(kv[0])):
        print(f"k={k}: acceptance length {a['acceptance_length']:.3f} over {a['drafts']} drafts; per position "
              + " / ".join(f"{p:.1%}" for p in a["per_position"]))
    if args.out:
        atomic_write_json(args.out, {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
            "cpus": os.cpu_count(), "engine_version": results.get("engine_version"),
            "target": results["target"], "drafter": results["drafter"], "prompts": results["prompts"],
            "sampling": results["sampling"], "concurrency": args.concurrency,
            "acceptance_by_k": by_k, "categories": results.get("categories"),
            "exit": rc})
    return rc


if __name__ == "__main__":
    sys.exit(main())
