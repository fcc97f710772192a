"""Instant stand-ins for the four phase bodies (the phase table TABLE, selected through
EAGLE3_PHASE_TABLE=noop_phases:TABLE or eagle3.phase_table.using) so the
orchestration (caching, retries, handoffs, deployments, workers) is exercised for real without
engines. Used by tests/flows/ and bench/flow_overhead_bench.py.

Each phase writes a small real output into its phase dir and appends one line per call to
<run_dir>/counts/<phase> (so a test can count how often a body actually ran, across processes).
Per-run-dir knobs in <run_dir>/knobs.json change behaviour:
  {"sleep": {"bench": 3},                 seconds to sleep in that phase
   "fail_once": {"train": "transient"},   first call raises TransientError ("transient") or GateError ("gate")
   "fail": {"bench": "gate"},             every call raises (same kinds)
   "child": ["datagen"],                  launch a supervised `sleep 600` and block until killed
   "ticks": {"extract": [8, 0.5]},        report progress i/8 (with details) every 0.5 s before finishing
   "service": ["extract"],                launch a supervised `sleep 600` first (ended with the phase)
   "edit_yaml": {"datagen": [PATH, {"train": {"epochs": 7}}]},  on its first call, merge the mapping into the
                                          YAML at PATH (an operator's edit while the run goes on)
   "die_after_done": ["datagen"],         once the phase's done marker is written, its process exits at once
                                          (code 3): a worker lost just after its shard finished
   "bench_report": true,                  bench writes a real report and results (synthetic numbers)
                                          and returns the summary the real phase returns; with
                                          fail_once bench "gate" it fails like a regression, summary attached
   "bench_watch": "engine regression"}    the watch verdict that summary carries (eagle3/bench/watch.py)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import yaml

from eagle3.errors import GateError, TransientError
from eagle3.phase_table import TABLE_ENV, with_runs
from eagle3.phases import PhaseSummary
from eagle3.progress import PhaseProgress
from eagle3.process.services import LaunchSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdata import synthetic_results  # noqa: E402

TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"
# Each stand-in's one output is output.txt (written last): a phase is done only while it exists.
TABLE = tuple(replace(p, outputs=("output.txt",))
              for p in with_runs({p: f"noop_phases:{p}" for p in ("datagen", "extract", "train", "bench")}))
# The same, with datagen shardable (EAGLE3_PHASE_TABLE=noop_phases:SHARDED): each shard writes its own
# output.txt in its shard run dir; the merge joins them (tests of the fan-out coordinator, no engines).
SHARDED = tuple(replace(p, shards="noop_phases:merge") if p.name == "datagen" else p for p in TABLE)


def merge(cfg, shard_cfgs) -> PhaseSummary:
    out = cfg.phase_dir("datagen")
    out.mkdir(parents=True, exist_ok=True)
    parts = [(s.phase_dir("datagen") / "output.txt").read_text() for s in shard_cfgs]
    (out / "output.txt").write_text("".join(parts))
    return PhaseSummary(str(out / "output.txt"), f"merged {len(parts)} shards", {"shards": len(parts)})


def overrides_env() -> dict[str, str]:
    """Environment that makes eagle3.phase_runner use these phases (this dir must be importable)."""
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {TABLE_ENV: "noop_phases:TABLE", "PYTHONPATH": path}


def write_noop_config(directory: Path, name: str = "noop", knobs: dict | None = None) -> Path:
    """A variant of configs/tiny-cpu.yaml that passes every file check without engines: a stub model
    dir, this interpreter as the engine python, free ports, and a private shm dir for the handoff (the
    machine's /dev/shm is not the test's to purge). Returns the config path; run_dir is directory/run."""
    from tests.ports import free_port  # here: workers import this module without the repo root on sys.path

    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(TINY_CONFIG.read_text())
    model = directory / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 8}))
    (directory / "shm").mkdir(exist_ok=True)
    raw["name"] = name
    raw["run_dir"] = str(directory / "run")
    raw["target"]["model"] = str(model)
    raw["datagen"]["prompts"] = str((TINY_CONFIG.parent / raw["datagen"]["prompts"]).resolve())
    for env in raw["engines"].values():
        env["python"] = sys.executable
    for phase in ("datagen", "extract", "bench"):
        raw[phase]["server"]["port"] = free_port()
    raw["handoff"].update({"shm_dir": str(directory / "shm"), "grace_s": 2, "deadline_s": 10})
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    if knobs:
        (directory / "run").mkdir(exist_ok=True)
        (directory / "run" / "knobs.json").write_text(json.dumps(knobs))
    return path


def counts(run_dir: Path) -> dict[str, int]:
    d = Path(run_dir) / "counts"
    return {p: len((d / p).read_text().splitlines()) if (d / p).exists() else 0
            for p in ("datagen", "extract", "train", "bench")}


def calls(run_dir: Path, phase: str) -> list[dict]:
    f = Path(run_dir) / "counts" / phase
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def _knobs(cfg) -> dict:
    f = cfg.run_dir / "knobs.json"
    return json.loads(f.read_text()) if f.exists() else {}


def _count(cfg, phase: str) -> int:
    d = cfg.run_dir / "counts"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / phase, "a") as f:  # one short O_APPEND write per call: atomic enough across processes
        f.write(json.dumps({"pid": os.getpid(), "t": time.time()}) + "\n")
    return len((d / phase).read_text().splitlines())


def _phase(phase: str, cfg, sup) -> PhaseSummary:
    n = _count(cfg, phase)
    knobs = _knobs(cfg)
    out = cfg.phase_dir(phase)
    out.mkdir(parents=True, exist_ok=True)
    kind = (knobs.get("fail_once", {}).get(phase) if n == 1 else None) or knobs.get("fail", {}).get(phase)
    report = _bench_report(cfg, out, regression=kind == "gate", watch=knobs.get("bench_watch")) \
        if phase == "bench" and knobs.get("bench_report") else None
    if kind:
        (out / "partial.txt").write_text("half done\n")
        if kind == "gate":
            err = GateError(f"{phase}: gate failed on purpose (call {n})")
            err.summary = PhaseSummary(report["results"], "regression", report) if report else None  # as bench does
            raise err
        raise TransientError(f"{phase}: transient failure on purpose (call {n})")
    if n == 1 and phase in knobs.get("edit_yaml", {}):
        where, update = knobs["edit_yaml"][phase]
        raw = yaml.safe_load(Path(where).read_text())
        for section, values in update.items():
            raw.setdefault(section, {}).update(values)
        Path(where).write_text(yaml.safe_dump(raw))
    if phase in knobs.get("child", []):
        proc = sup.launch(LaunchSpec(name=f"{phase}-child", argv=["sleep", "600"], log=out / "child.log", phase=phase))
        (out / "child.json").write_text(json.dumps({"pid": proc.pid, "pgid": proc.entry.pgid,
                                                    "start_ticks": proc.entry.start_ticks}))
        while True:  # until the run is cancelled
            time.sleep(0.2)
    if phase in knobs.get("service", []):
        proc = sup.launch(LaunchSpec(name=f"{phase}-standin-server", argv=["sleep", "600"], log=out / "service.log",
                                     phase=phase))
        (out / "service.json").write_text(json.dumps({"pid": proc.pid, "start_ticks": proc.entry.start_ticks}))
    if knobs.get("sleep", {}).get(phase):
        time.sleep(float(knobs["sleep"][phase]))
    if phase in knobs.get("die_after_done", []):
        threading.Thread(target=_exit_once_done, args=(cfg.layout.done_marker(phase),), daemon=True).start()
    tick = PhaseProgress(phase, unit="items")
    ticks, every = knobs.get("ticks", {}).get(phase, (1, 0.0))
    for i in range(1, int(ticks) + 1):
        time.sleep(float(every))
        tick(i, int(ticks), tok_s=10.0 * i)
    (out / "output.txt").write_text(f"{phase} output of call {n} (pid {os.getpid()})\n")
    output = str(out / "output.txt")
    return PhaseSummary(output, f"{phase} call {n}", {"calls": n, "output": output, **(report or {})})


def _exit_once_done(marker: Path) -> None:
    while not marker.exists():
        time.sleep(0.005)
    os._exit(3)


def _bench_report(cfg, out: Path, regression: bool, watch: str | None = None) -> dict:
    """What the real bench phase leaves and returns, from synthetic numbers (eagle3.bench.report renders them)."""
    from eagle3.bench.report import write_report

    results = synthetic_results(cfg.name, trained=regression, floor=3.0 if regression else 1.3)
    (out / "results.json").write_text(json.dumps(results))
    write_report(results, out / "report.md")
    return {"results": str(out / "results.json"), "report": str(out / "report.md"),
            "table": results["table"], "gate": results["gate"]["status"], "trained": regression, "watch": watch,
            "watch_message": f"{watch} (a stand-in's verdict)" if watch else None, "fail_on_regression": True}


def datagen(cfg, sup, shard=None):
    return _phase("datagen", cfg, sup)


def extract(cfg, sup, shard=None):
    return _phase("extract", cfg, sup)


def train(cfg, sup, shard=None):
    return _phase("train", cfg, sup)


def bench(cfg, sup, shard=None):
    return _phase("bench", cfg, sup)


if __name__ == "__main__":
    print(json.dumps(overrides_env()), file=sys.stdout)
