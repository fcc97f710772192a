"""Time before the first phase: what `eagle3 run` does before it (the run's Prefect server, the
preflight doctor with its engine probes), one after the other as before, against the probes asked
while the server starts (eagle3.doctor.warm_engine_probes, as `eagle3 run` does now), on a cold
probe cache; then a rerun in the same run dir, whose probes are cached.

Each repetition uses a fresh run dir and an empty user probe cache (XDG_CACHE_HOME), alternating the
order of the two cold variants.

    .venv/bin/python bench/first_phase_bench.py --reps 2 --out bench/results/first-phase-cpu-DATE.json
    .venv/bin/python bench/first_phase_bench.py --smoke     # CI: one rep, no engine probes, not a measurement
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

from eagle3.config import TINY_CONFIG  # noqa: E402
from eagle3.doctor import run_doctor, warm_engine_probes  # noqa: E402
from eagle3.process.services import Supervisor  # noqa: E402
from flows.local_server import start_local_server  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402


def one(root: Path, overlapped: bool, engines: bool, cfg=None) -> tuple[dict, object]:
    """Seconds to the end of the preflight, from nothing started."""
    cfg = cfg or write_tiny_config(root, None)
    sup = Supervisor(cfg.layout.state)
    t0 = time.monotonic()
    warming = warm_engine_probes(cfg) if overlapped and engines else None
    server, _ = start_local_server(sup, cfg.layout.logs)
    t_server = time.monotonic() - t0
    try:
        if warming is not None:
            warming.join()
        t_probes = time.monotonic() - t0
        checks = run_doctor(cfg, sup, engines=engines)
    finally:
        server.stop()
    total = time.monotonic() - t0
    return {"server_s": round(t_server, 2), "before_doctor_s": round(t_probes, 2), "to_first_phase_s": round(total, 2),
            "checks": {s: sum(1 for c in checks if c.status == s) for s in {c.status for c in checks}}}, cfg


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    reps, engines = (1, False) if args.smoke else (args.reps, True)
    rows = []
    for rep in range(reps):
        order = (False, True) if rep % 2 == 0 else (True, False)
        row = {"rep": rep + 1, "order": ["overlapped" if o else "serial" for o in order]}
        for overlapped in order:
            with tempfile.TemporaryDirectory(prefix="eagle3-first-phase-") as tmp:
                os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # a cold user probe cache
                cold, cfg = one(Path(tmp), overlapped, engines)
                row["overlapped" if overlapped else "serial"] = cold
                if overlapped:
                    row["rerun"], _ = one(Path(tmp), True, engines, cfg)  # same run dir: probes cached
        rows.append(row)
        print(json.dumps(row), flush=True)
    med = {k: statistics.median(r[k]["to_first_phase_s"] for r in rows) for k in ("serial", "overlapped", "rerun")}
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": f"{platform.node()} {os.cpu_count()} CPUs",
              "config": str(TINY_CONFIG), "reps": rows, "median_to_first_phase_s": med,
              "overlapped_over_serial": round(med["overlapped"] / med["serial"], 3)}
    if args.smoke:
        result["smoke"] = "one rep without engine probes: not a measurement"
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
