"""Time before the first phase: what `eagle3 run` does before it (the run's Prefect server, the
preflight doctor with its engine probes), three ways on a cold probe cache: one after the other
("serial"); the probes asked one by one while the server starts ("overlapped-one-by-one", 2026-12-04
to 05); every probe at once while the server starts (eagle3.doctor.warm_engine_probes, as `eagle3 run`
does now: "overlapped"); then a rerun in the same run dir, whose probes are cached.

Each repetition uses a fresh run dir and an empty user probe cache (XDG_CACHE_HOME), rotating the
order of the three cold variants.

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


VARIANTS = ("serial", "overlapped-one-by-one", "overlapped")


def one(root: Path, variant: str, engines: bool, cfg=None) -> tuple[dict, object]:
    """Seconds to the end of the preflight, from nothing started."""
    cfg = cfg or write_tiny_config(root, None)
    sup = Supervisor(cfg.layout.state)
    t0 = time.monotonic()
    overlapped = variant != "serial" and engines
    warming = warm_engine_probes(cfg, at_once=variant == "overlapped") if overlapped else None
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
        order = VARIANTS[rep % 3:] + VARIANTS[:rep % 3]
        row = {"rep": rep + 1, "order": list(order)}
        for variant in order:
            with tempfile.TemporaryDirectory(prefix="eagle3-first-phase-") as tmp:
                os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # a cold user probe cache
                row[variant], cfg = one(Path(tmp), variant, engines)
                if variant == "overlapped":
                    row["rerun"], _ = one(Path(tmp), variant, engines, cfg)  # same run dir: probes cached
        rows.append(row)
        print(json.dumps(row), flush=True)
    med = {k: statistics.median(r[k]["to_first_phase_s"] for r in rows) for k in (*VARIANTS, "rerun")}
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": f"{platform.node()} {os.cpu_count()} CPUs",
              "config": str(TINY_CONFIG), "reps": rows, "median_to_first_phase_s": med,
              "overlapped_over_serial": round(med["overlapped"] / med["serial"], 3),
              "overlapped_over_one_by_one": round(med["overlapped"] / med["overlapped-one-by-one"], 3)}
    if args.smoke:
        result["smoke"] = "one rep without engine probes: not a measurement"
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
