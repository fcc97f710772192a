"""What moves a benchmark window's speed on a GPU: a side record of the machine's state while the
benchmark runs, and its comparison with the benchmark's own per-request timings.

On the H200 (2026-12-04, run3) the same 48 greedy requests, identical output each time, ran at a
per-request TPOT that jumped between levels (~1.55, 1.95, 2.2, 2.45 ms) in runs of several requests,
so one window differed from the next by up to 10 %. A level that lasts seconds is a machine state,
not the request: this records the candidates side by side (issue 37: "find out what dominates the
noise"): the GPU's SM and memory clocks, its clock-event reasons (power, thermal, idle), utilisation,
power and temperature; the CPUs' load, the hypervisor's steal time and the CPU clock the kernel reports;
and where the busiest processes run (core number, CPU %). On 2026-12-05 (run6) the SM clock never moved
while a window's speed moved by 8-16 %, and the busy engine core's CPU number did not sort fast windows
from slow ones: steal time is the next candidate on a 16-vCPU virtual machine.
It only reads: NVML queries and /proc.

    python bench/noise_sampler.py sample OUT.jsonl [--interval 0.2]   # until SIGTERM / SIGINT
    python bench/noise_sampler.py explain OUT.jsonl RESULTS.json [--json OUT]   # per request: TPOT
        beside the SM clock and the CPU load sampled during it; correlations and TPOT by clock level
    python bench/noise_sampler.py --smoke    # CI: a few samples without NVML, then explain on them
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from bisect import bisect_left, bisect_right
from pathlib import Path

import psutil

TOP = 6  # busiest processes recorded per sample


class _Gpu:
    """NVML reads of the figures that move a small model's step time; absent fields stay None."""

    def __init__(self):
        import pynvml as nv
        nv.nvmlInit()
        self.nv = nv
        self.handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]

    def read(self) -> list[dict]:
        nv, out = self.nv, []
        for i, h in enumerate(self.handles):
            def ask(fn, *args):
                try:
                    return fn(h, *args)
                except nv.NVMLError:
                    return None
            util = ask(nv.nvmlDeviceGetUtilizationRates)
            power = ask(nv.nvmlDeviceGetPowerUsage)
            reasons = ask(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                          or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
            out.append({"gpu": i, "sm_mhz": ask(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
                        "mem_mhz": ask(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
                        "util": None if util is None else util.gpu,
                        "power_w": None if power is None else round(power / 1000, 1),
                        "temp_c": ask(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
                        "pstate": ask(nv.nvmlDeviceGetPerformanceState),
                        "clock_reasons": reasons})
        return out

    def close(self) -> None:
        self.nv.nvmlShutdown()


def _busiest(prev: dict[int, float], interval: float) -> tuple[list[dict], dict[int, float]]:
    """The TOP processes by CPU time over the last interval, with the core each last ran on."""
    now, rows = {}, []
    for p in psutil.process_iter(["pid", "name", "cpu_times", "cpu_num"]):
        info = p.info
        if info["cpu_times"] is None:
            continue
        total = info["cpu_times"].user + info["cpu_times"].system
        now[info["pid"]] = total
        if info["pid"] in prev:
            rows.append({"pid": info["pid"], "name": info["name"], "cpu": info["cpu_num"],
                         "pct": round(100 * (total - prev[info["pid"]]) / interval, 1)})
    rows.sort(key=lambda r: -r["pct"])
    return rows[:TOP], now


def _host() -> dict:
    """What a virtual machine's guest can see of its host: the share of time the hypervisor ran something
    else while a vCPU wanted to run (steal, since the last call), and the clock the kernel reports."""
    times = psutil.cpu_times_percent()
    freq = psutil.cpu_freq()
    return {"steal_pct": getattr(times, "steal", None), "cpu_mhz": round(freq.current) if freq else None}


def sample(out: Path, interval: float, gpu: bool, count: int | None = None) -> int:
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    g = _Gpu() if gpu else None
    psutil.cpu_percent(percpu=True)
    psutil.cpu_times_percent()
    _, prev = _busiest({}, interval)
    n = 0
    with out.open("a") as f:
        while not stop and (count is None or n < count):
            time.sleep(interval)
            row = {"t": round(time.time(), 3), "cpu_pct": psutil.cpu_percent(percpu=True),
                   "load1": os.getloadavg()[0], **_host()}
            row["procs"], prev = _busiest(prev, interval)
            if g is not None:
                row["gpus"] = g.read()
            f.write(json.dumps(row) + "\n")
            f.flush()
            n += 1
    if g is not None:
        g.close()
    return n


def _requests(results: dict) -> list[dict]:
    """Each concurrency-1 request of every window with its (approximate) wall-clock span: the load
    generator sends them one after another, so request i starts where request i-1 ended."""
    rows = []
    for server in results["servers"]:
        for w in server["windows"]:
            if w["concurrency"] != 1:
                continue
            t = w["started_at"]
            for r in w["load"].get("requests") or []:
                span = r["latency_ms"] / 1000
                if r["output_tokens"] > 1:
                    rows.append({"server": server["label"], "k": server["k"], "start": t, "end": t + span,
                                 "tpot_ms": (r["latency_ms"] - r["ttft_ms"]) / (r["output_tokens"] - 1)})
                t += span
    return rows


def _corr(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    cov = statistics.fmean([(x - mx) * (y - my) for x, y in zip(xs, ys)])
    return round(cov / (statistics.pstdev(xs) * statistics.pstdev(ys)), 3)


def explain(samples_path: Path, results: dict) -> dict:
    """Per baseline/k server: how TPOT varies, and how much of it goes with the SM clock, the busiest
    process's CPU share and the machine's CPU load sampled during each request."""
    samples = [json.loads(line) for line in samples_path.read_text().splitlines() if line.strip()]
    times = [s["t"] for s in samples]
    out = {"samples": len(samples), "servers": {}}
    for req in _requests(results):
        inside = samples[bisect_left(times, req["start"]):bisect_right(times, req["end"])]
        if not inside:  # shorter than one interval: the nearest sample
            i = min(bisect_left(times, req["start"]), len(samples) - 1)
            inside = samples[i:i + 1] if samples else []
        if not inside:
            continue
        sm = [s["gpus"][0]["sm_mhz"] for s in inside if s.get("gpus") and s["gpus"][0]["sm_mhz"]]
        req["sm_mhz"] = statistics.fmean(sm) if sm else None
        req["cpu_mean_pct"] = statistics.fmean(statistics.fmean(s["cpu_pct"]) for s in inside)
        req["top_proc_pct"] = statistics.fmean(s["procs"][0]["pct"] if s["procs"] else 0.0 for s in inside)
        for key in ("steal_pct", "cpu_mhz"):  # absent from samples taken before 2026-12-05
            seen = [s[key] for s in inside if s.get(key) is not None]
            req[key] = statistics.fmean(seen) if seen else None
        out["servers"].setdefault(req["server"], []).append(req)
    summary = {}
    for label, reqs in out.pop("servers").items():
        tpot = [r["tpot_ms"] for r in reqs]
        row = {"requests": len(reqs), "tpot_mean_ms": round(statistics.fmean(tpot), 3),
               "tpot_cv_pct": round(100 * statistics.pstdev(tpot) / statistics.fmean(tpot), 1)}
        for key in ("sm_mhz", "cpu_mean_pct", "top_proc_pct", "steal_pct", "cpu_mhz"):
            pairs = [(r[key], r["tpot_ms"]) for r in reqs if r.get(key) is not None]
            row[f"corr_tpot_{key}"] = _corr([p[0] for p in pairs], [p[1] for p in pairs]) if pairs else None
        levels: dict[int, list[float]] = {}
        for r in reqs:
            if r.get("sm_mhz"):
                levels.setdefault(int(round(r["sm_mhz"], -2)), []).append(r["tpot_ms"])
        row["tpot_by_sm_mhz"] = {str(k): {"requests": len(v), "tpot_mean_ms": round(statistics.fmean(v), 3)}
                                 for k, v in sorted(levels.items())}
        summary[label] = row
    out["servers"] = summary
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", choices=["sample", "explain"])
    ap.add_argument("samples", nargs="?", type=Path)
    ap.add_argument("results", nargs="?", type=Path)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:  # no NVML: the CPU side of sampling, and explain on a one-request stand-in result
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "samples.jsonl"
            t0 = time.time()
            n = sample(path, 0.05, gpu=False, count=4)
            fake = {"servers": [{"label": "baseline", "k": 0, "windows": [{"concurrency": 1, "started_at": t0, "load": {
                "requests": [{"latency_ms": 1000 * (time.time() - t0), "ttft_ms": 1.0, "output_tokens": 9}]}}]}]}
            print(json.dumps({"sampled": n, "explain": explain(path, fake), "smoke": "not a measurement"}))
        return 0
    if args.mode == "sample" and args.samples:
        sample(args.samples, args.interval, gpu=True)
        return 0
    if args.mode == "explain" and args.samples and args.results:
        result = explain(args.samples, json.loads(args.results.read_text()))
        text = json.dumps(result, indent=2)
        if args.json:
            args.json.write_text(text + "\n")
        print(text)
        return 0
    ap.error("usage: sample OUT.jsonl | explain OUT.jsonl RESULTS.json | --smoke")
    return 2


if __name__ == "__main__":
    sys.exit(main())
