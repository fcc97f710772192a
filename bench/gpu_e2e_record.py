"""The record of bench/gpu_e2e.sh: what the runs' own files say, gathered into one raw JSON and the
summary (`gpu-e2e-summary.json`). Nothing here measures anything; every figure comes from a file the
pack wrote during the run (DONE markers, handoff reports, server-starts.jsonl, the engines' own server
logs, the train manifest, the benchmark's results.json), so the record can be rebuilt at any time.

    python bench/gpu_e2e_record.py --results DIR --run offline=RUN_DIR [--run online=RUN_DIR] \\
        [--config offline=CONFIG ...]

Labels: the benchmark prompts are the generator's held-out split (never used by data generation);
the drafter is the one this run trained; the machine is whatever machine.txt says.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

from eagle3.layout import RunLayout

PHASES = ("datagen", "extract", "train", "bench")
LAUNCH = "==> eagle3: launching "
# What vLLM itself prints about a start (0.25 says "took ... s", older releases "takes ... seconds").
VLLM_TIMINGS = {
    "load_s": re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds"),
    "compile_s": re.compile(r"torch\.compile (?:takes|took) ([\d.]+) s in total"),
    "graph_capture_s": re.compile(r"Graph capturing finished in ([\d.]+) secs"),
    "init_engine_s": re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
}


def read_json(path: Path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def launches(log: Path) -> list[dict]:
    """One entry per launch recorded in a server log: its name and what vLLM said it spent."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for chunk in text.split(LAUNCH)[1:]:
        name = chunk.split(":", 1)[0].strip()
        timings = {}
        for key, pattern in VLLM_TIMINGS.items():
            found = [float(m) for m in pattern.findall(chunk)]
            if found:
                timings[key] = round(sum(found), 3)  # a drafter is loaded, compiled and captured too
        loads = len(VLLM_TIMINGS["load_s"].findall(chunk))
        out.append({"name": name, "log": str(log), "vllm": timings, "model_loads": loads})
    return out


def run_record(run_dir: Path) -> dict:
    layout = RunLayout(run_dir)
    phases = {}
    for phase in PHASES:
        marker = read_json(layout.done_marker(phase))
        if marker:
            phases[phase] = {"seconds": round(marker["finished_at"] - marker["started_at"], 2),
                             "summary": (marker.get("summary") or {}).get("headline")}
    handoffs = []
    for path in sorted(layout.handoffs.glob("*.json")):
        h = read_json(path) or {}
        handoffs.append({"label": h.get("label"), "seconds": h.get("seconds"), "ok": h.get("ok"),
                         "gpu_check": h.get("gpu_check"), "started_at": h.get("started_at"),
                         "steps": {s["name"]: s["seconds"] for s in h.get("steps", [])}})
    starts = jsonl(layout.server_starts)
    logs = sorted(run_dir.glob("*/logs/*server*.log"))  # every server a phase started (a bench round: one log each)
    launched = [entry for log in logs for entry in launches(log)]
    train = read_json(run_dir / "train" / "manifest.json") or {}
    bench = read_json(run_dir / "bench" / "results.json") or {}
    return {"run_dir": str(run_dir), "phases": phases, "handoffs": handoffs, "server_starts": starts,
            "server_launches": launched, "train_manifest": train, "bench_results": bench,
            "datagen_summary": read_json(run_dir / "datagen" / "summary.json"),
            "extract_summary": read_json(run_dir / "extract" / "summary.json"),
            "run_state": read_json(layout.run_record)}


def heldout(bench: dict) -> dict | None:
    rows = bench.get("table") or []
    ks = sorted({r["k"] for r in rows if r["k"]})
    if not ks:
        return None
    k = ks[-1]
    by_c = {r["concurrency"]: r for r in rows if r["k"] == k}
    acc = (bench.get("acceptance_by_k") or {}).get(str(k)) or {}
    return {"k": k, "acceptance_length": acc.get("acceptance_length"),
            "per_position_pct": [round(p * 100, 1) for p in acc.get("per_position") or []],
            "speedup_c1": (by_c.get(1) or {}).get("speedup"), "speedup_c4": (by_c.get(4) or {}).get("speedup"),
            # From repeated windows (bench.windows, bench.rounds); absent in records made before them.
            "speedup_ci": {str(c): r.get("speedup_ci") for c, r in sorted(by_c.items())},
            "verdict": {str(c): r.get("verdict") for c, r in sorted(by_c.items())},
            "windows": {str(c): r.get("windows", 1) for c, r in sorted(by_c.items())},
            "aa": (bench.get("aa") or {}).get("status"),
            "aa_twin": {key: (bench.get("aa_twin") or {}).get(key) for key in ("status", "noise_floor_pct", "rows")}
            if bench.get("aa_twin") else None,
            "step_cost": {str(c): r.get("step_cost") for c, r in sorted(by_c.items())},
            "length_needed_for_1_3x": {str(c): r.get("length_needed") for c, r in sorted(by_c.items())},
            "tpot_ms": {str(c): {"k": r.get("mean_tpot_ms"),
                                 "baseline": next((b.get("mean_tpot_ms") for b in rows
                                                   if b["k"] == 0 and b["concurrency"] == c), None)}
                        for c, r in sorted(by_c.items())},
            "per_k": per_k(bench),
            "prompts": {key: (bench.get("prompts") or {}).get(key) for key in ("path", "selection", "count")},
            "drafter": {key: (bench.get("drafter") or {}).get(key) for key in ("path", "trained", "status", "data")},
            "gate": (bench.get("gate") or {}).get("status")}


def per_k(bench: dict) -> dict:
    """Every k measured: its acceptance, and per concurrency its speedup (with interval and verdict),
    TPOT, the step cost in plain steps and the acceptance length 1.3x would need at that cost."""
    rows, out = bench.get("table") or [], {}
    for k in sorted({r["k"] for r in rows if r["k"]}):
        acc = (bench.get("acceptance_by_k") or {}).get(str(k)) or {}
        out[str(k)] = {"acceptance_length": acc.get("acceptance_length"), "by_concurrency": {
            str(r["concurrency"]): {key: r.get(key) for key in ("speedup", "speedup_ci", "verdict", "mean_tpot_ms",
                                                               "output_tok_s", "step_cost", "length_needed")}
            for r in rows if r["k"] == k}}
    return out


def _log_key(path: str) -> tuple:
    """<phase>/logs/<file>: the same log whether the run dir was read where it ran or unpacked elsewhere."""
    return tuple(Path(path).parts[-3:])


def server_starts(rec: dict) -> list[dict]:
    """Each ready server with its seconds to ready and what vLLM said it spent on load, compile and
    graph capture: the n-th start of a log goes with the n-th launch in it that loaded a model."""
    loaded: dict[tuple, list[dict]] = {}
    for launch in rec["server_launches"]:
        if launch["model_loads"]:
            loaded.setdefault(_log_key(launch["log"]), []).append(launch)
    out = []
    for start in rec["server_starts"]:
        queue = loaded.get(_log_key(start.get("log", "")), [])
        vllm = queue.pop(0)["vllm"] if queue else {}
        out.append({"name": start["name"], "phase": start.get("phase"), "seconds": start["seconds"], **vllm})
    return out


def labels(bench: dict, machine: dict) -> str | None:
    """What the benchmark figures are, in words, from the results themselves."""
    if not bench:
        return None
    drafter, prompts = bench.get("drafter") or {}, bench.get("prompts") or {}
    who = ("a drafter trained by this run" if drafter.get("trained") and drafter.get("source") == "train manifest"
           else drafter.get("status") or "unknown drafter")
    where = "CPU rehearsal" if bench.get("cpu_rehearsal") else (machine.get("machine") or "unknown machine")
    return f"{prompts.get('count')} prompts from {prompts.get('path')} ({prompts.get('selection')}); {who}; {where}"


def summary(name: str, rec: dict, machine: dict) -> dict:
    bench = rec["bench_results"]
    starts = server_starts(rec)
    return {
        "run": name, "machine": machine.get("machine"), "date": machine.get("date"),
        # Records made before the probe existed stay as they were.
        **({"host_single_thread_s": machine["host_single_thread_s"]} if machine.get("host_single_thread_s") else {}),
        "vllm": machine.get("versions", {}).get("vllm"), "torch": machine.get("versions", {}).get("torch"),
        "phases": {p: v["seconds"] for p, v in rec["phases"].items()},
        "server_starts": starts,
        # Each engine server loads the target once ("Model loading took": the k servers' line covers the
        # drafter loaded beside it); a launch stopped before it loaded (a resumed run) loaded nothing.
        "target_loads": sum(1 for launch in rec["server_launches"] if launch["model_loads"]),
        "server_launches": len(rec["server_launches"]),
        "handoffs": [{"label": h["label"], "seconds": h["seconds"], "ok": h["ok"]} for h in rec["handoffs"]],
        # An interleaved round's servers: side by side or one by one, first launch to last ready (bench.py).
        "bench_round_starts": bench.get("round_starts"),
        "train_val_acc": rec["train_manifest"].get("val_full_acc"),
        "heldout": heldout(bench),
        "parity": (bench.get("parity") or {}).get("status"),
        "labels": labels(bench, machine),
    }


def machine_info(results: Path) -> dict:
    text = (results / "machine.txt").read_text() if (results / "machine.txt").exists() else ""
    versions = {}
    for line in text.splitlines():
        if line.startswith('{"versions"'):
            versions = json.loads(line)["versions"]
    gpu = next((ln for ln in text.splitlines() if ", NVIDIA" in ln or "H200" in ln), "")
    # Step costs are compared across hosts of one GPU kind: the host's single-thread speed goes beside them.
    probe = re.search(r"^host single-thread probe: ([0-9.]+) s", text, re.M)
    return {"machine": f"{gpu.strip()} ({text.splitlines()[2].strip()} CPUs)" if gpu and len(text.splitlines()) > 2
            else gpu.strip() or None,
            "date": text.splitlines()[0].strip() if text else None, "versions": versions,
            "host_single_thread_s": float(probe.group(1)) if probe else None, "raw": text}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--run", action="append", default=[], help="NAME=RUN_DIR")
    ap.add_argument("--config", action="append", default=[], help="NAME=CONFIG (recorded as given)")
    args = ap.parse_args()
    machine = machine_info(args.results)
    runs = {}
    for item in args.run:
        name, _, path = item.partition("=")
        if Path(path).is_dir():
            runs[name] = run_record(Path(path))
    configs = {}
    for item in args.config:
        name, _, path = item.partition("=")
        configs[name] = Path(path).read_text() if Path(path).is_file() else None
    day = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")
    raw = {"machine": machine, "events": jsonl(args.results / "events.jsonl"), "configs": configs, "runs": runs}
    (args.results / f"gpu-e2e-h200-{day}.json").write_text(json.dumps(raw, indent=1, default=str))
    summaries = {name: summary(name, rec, machine) for name, rec in runs.items()}
    main_run = summaries.get("offline") or summaries.get("real") or next(iter(summaries.values()), {})
    out = {**main_run, "runs": summaries}
    (args.results / "gpu-e2e-summary.json").write_text(json.dumps(out, indent=1, default=str))
    print(json.dumps({n: {k: s[k] for k in ("phases", "target_loads", "heldout", "parity", "bench_round_starts")}
                      for n, s in summaries.items()},
                     default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
