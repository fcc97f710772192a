"""Preflight doctor: what can be known before paying for a long model load, said in seconds.

Every check yields one line: PASS / WARN / FAIL, why, and what to do. The checks that need an
engine run its own interpreter (its Engine's inspect_script, `engine_side/inspect_<engine>.py`) and never load weights; their
answers are cached per (engine interpreter, target config) in the run dir.

  check.py          one check's verdict (Check), and DoctorFailed
  static_checks.py  the checks that need no engine (GPUs, files, ports, disk, layers, the drafter)
  engine_checks.py  the checks that ask the engines, and their warm-up beside `eagle3 run`'s Prefect server
"""

from __future__ import annotations

import time
from dataclasses import asdict

from .. import progress
from ..config import PipelineConfig
from ..fsio import atomic_write_json
from ..process.services import Supervisor
from .check import FAIL, PASS, WARN, Check, DoctorFailed
from .engine_checks import (check_engine_env, check_load_generator, check_target_support, check_trainer,
                            engine_check_groups, engine_checks, missing_architectures, uninspected_engine,
                            warm_engine_probes)
from .static_checks import (check_aux_layers, check_disk, check_drafter, check_gpus, check_model_files,
                            check_network_exposure, check_ports, check_shm, check_tensor_parallel, tp_splits)


def run_doctor(cfg: PipelineConfig, sup: Supervisor | None = None, engines: bool = True) -> list[Check]:
    sup = sup or Supervisor(cfg.layout.state)
    checks: list[Check] = []
    progress.emit(progress.Event("preflight", progress.START, message="doctor: GPUs, model files, ports, disk, "
                                 f"layers{', engine probes (seconds each)' if engines else ''}"))

    def timed(fn, *args):
        t0 = time.monotonic()
        result = fn(*args)
        items = result if isinstance(result, list) else [result] if result else []
        for c in items:
            c.seconds = round(time.monotonic() - t0, 2)
        checks.extend(items)

    timed(check_gpus, cfg)
    timed(check_model_files, cfg)
    timed(check_ports, cfg, sup)
    timed(check_shm, cfg)
    timed(check_tensor_parallel, cfg)
    timed(check_disk, cfg)
    timed(check_aux_layers, cfg)
    timed(check_network_exposure, cfg)
    for fn, args in engine_checks(cfg, sup) if engines else ():
        timed(fn, *args)
    timed(check_drafter, cfg)
    atomic_write_json(cfg.layout.doctor / "report.json", [asdict(c) for c in checks])
    counts = {s: sum(1 for c in checks if c.status == s) for s in (PASS, WARN, FAIL)}
    progress.emit(progress.Event("preflight", progress.END, ok=not counts[FAIL],
                                 message=", ".join(f"{n} {s}" for s, n in counts.items() if n)))
    return checks


def failed(checks: list[Check]) -> bool:
    return any(c.status == FAIL for c in checks)


__all__ = ["FAIL", "PASS", "WARN", "Check", "DoctorFailed", "check_aux_layers", "check_disk", "check_drafter",
           "check_engine_env", "check_gpus", "check_load_generator", "check_model_files", "check_network_exposure",
           "check_ports", "check_shm", "check_target_support", "check_tensor_parallel", "check_trainer",
           "engine_check_groups", "engine_checks", "failed", "missing_architectures", "run_doctor", "tp_splits",
           "uninspected_engine", "warm_engine_probes"]
