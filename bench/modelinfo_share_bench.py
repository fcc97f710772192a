"""A server start with new flags: vLLM's model-inspection answer from the directory every key of one
vLLM version shares (eagle3/engines/compile_cache.py) against none (as when each key had its own),
side by side, alternating.

Every start gets flags no earlier start had (`--seed N`), so each is a first start of its compile key;
the "own" starts find no answer (the shared modelinfos emptied first) and vLLM inspects the model class
in a subprocess that imports torch and vLLM again; the "shared" starts find the answer an earlier start
left. The tiny CPU config (eager, no compile), on vLLM's CPU build.

    .venv/bin/python bench/modelinfo_share_bench.py --rounds 3 --out bench/results/modelinfo-share-cpu-DATE.json
    .venv/bin/python bench/modelinfo_share_bench.py --smoke     # CI: one round; not a measurement
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from eagle3.engines.probe import inspect_engine  # noqa: E402
from eagle3.engines.serving import start_server  # noqa: E402
from eagle3.process.services import Supervisor, state_dir_for  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402
from tests.ports import free_port  # noqa: E402


def start(root: Path, seed: int) -> dict:
    """One start of the tiny datagen server with flags no earlier start had; its time to ready and steps."""
    cfg = write_tiny_config(root / f"start-{seed}", {"datagen": {"server": {
        "port": free_port(), "extra_args": ["--enforce-eager", "--seed", str(seed)]}}})
    sup = Supervisor(state_dir_for(cfg.run_dir))
    inspect_engine(cfg, sup, "vllm")  # as the preflight does: the probed versions key the compile cache
    t0 = time.monotonic()
    proc = start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
    seconds = time.monotonic() - t0
    proc.stop()
    row = json.loads(cfg.layout.server_starts.read_text().splitlines()[-1])
    return {"seconds": round(seconds, 2), "steps": row["steps"], "key": row["compile_cache"]["key"],
            "shared": row["compile_cache"]["shared"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="one round (CI): not a measurement")
    args = ap.parse_args()
    rounds = 1 if args.smoke else args.rounds
    rows, seed = [], 1000
    with tempfile.TemporaryDirectory(prefix="eagle3-modelinfo-") as tmp:
        root = Path(tmp)
        os.environ["XDG_CACHE_HOME"] = str(root / "cache")  # a compile cache of this bench's own
        (root / "cache").mkdir(mode=0o700)
        warm = start(root, seed)  # the first start of all: fills the shared answers
        infos = Path(warm["shared"]) / "modelinfos"
        answers = {p.name: p.read_bytes() for p in infos.glob("*.json")}
        if not answers:
            raise SystemExit(f"no model-inspection answer in {infos} after a start: nothing to compare")
        print(json.dumps({"warm-up": warm, "answers": sorted(answers)}), flush=True)
        for r in range(rounds):
            row = {"round": r + 1}
            for variant in (("own", "shared") if r % 2 == 0 else ("shared", "own")):
                for p in infos.glob("*.json"):
                    p.unlink()
                if variant == "shared":
                    for name, data in answers.items():
                        (infos / name).write_bytes(data)
                seed += 1
                row[variant] = start(root, seed)
            rows.append(row)
            print(json.dumps(row), flush=True)
    med = {v: statistics.median(r[v]["seconds"] for r in rows) for v in ("own", "shared")}
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": f"{platform.node()} {os.cpu_count()} CPUs",
              "rounds": rows, "median_s": med, "shared_over_own": round(med["shared"] / med["own"], 3),
              "per_round_ratio": [round(r["shared"]["seconds"] / r["own"]["seconds"], 3) for r in rows]}
    if args.smoke:
        result["smoke"] = "one round: not a measurement"
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
