"""Where the time before a phase and a server's first log line goes: Python imports, timed on this machine.

On the H200 machine `eagle3 run` waited 37-52 s before its first phase (about 9 s on the 2-core CPU box;
the engine probes, it turned out, not the Prefect server) and each vLLM start spent 45-52 s outside vLLM's
engine init, mostly before the API server's first log line.
This times the pieces in fresh processes, each twice (the second with the page cache warm), beside a
fixed pure-Python loop that says how fast one core of this machine is:

  - `python3 -c pass`, and the loop (one core's speed);
  - the pack's side: `import prefect.server.api.server`, then the run's Prefect server started as
    `eagle3 run` starts it (flows/local_server.py) until its /health answers, on a fresh database (which
    Prefect migrates first) and again on the same one;
  - the engine's side (--engine-python, e.g. .gpu-engine/bin/python): `import torch`,
    `import vllm.entrypoints.openai.api_server`.

Every import is run with `-X importtime`; the JSON keeps the seconds and, per import, the ten top-level
packages that took longest (cumulative) and the ten slowest modules by their own time. While the Prefect
server starts, it writes its threads' stacks every `--stacks-every` seconds (a sampling thread, loaded through a
sitecustomize of the probe's own): the JSON keeps the innermost frames, most seen first, so a start that
waits says on what. (The 37-41 s before the first phase on the H200 machine, once put down to the
server, were the engine probes waited on after it: bench/RESULTS.md, 2026-12-05.)

    python bench/startup_probe.py --engine-python .gpu-engine/bin/python --out startup-probe.json
    python bench/startup_probe.py --smoke     # CI: `pass` and the loop only; measures nothing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the run's Prefect server is started by the pack's own code (flows/local_server.py)
LOOP = "import time; t = time.perf_counter(); s = 0\nfor i in range(10_000_000): s += i\nprint(time.perf_counter() - t)"


def importtime_summary(stderr: str, top: int = 10) -> dict:
    """`-X importtime` lines -> the slowest top-level packages (cumulative) and modules (self), in seconds."""
    by_package: dict[str, int] = defaultdict(int)
    by_module: list[tuple[int, str]] = []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        try:
            self_us, cumulative_us, name = line.removeprefix("import time:").split("|", 2)
            self_us, cumulative_us, name = int(self_us), int(cumulative_us), name[1:]  # one space, then the nesting
        except ValueError:
            continue
        if name == name.lstrip():  # a top-level import: its cumulative time is all of it
            by_package[name.split(".")[0]] += cumulative_us
        by_module.append((self_us, name.strip()))
    return {"packages_s": {k: round(v / 1e6, 3) for k, v in sorted(by_package.items(), key=lambda kv: -kv[1])[:top]},
            "modules_self_s": {n: round(us / 1e6, 3) for us, n in sorted(by_module, reverse=True)[:top]},
            "modules": len(by_module)}


def timed(argv: list[str], env: dict | None = None, importtime: bool = False) -> dict:
    t = time.perf_counter()
    proc = subprocess.run(argv[:1] + (["-X", "importtime"] if importtime else []) + argv[1:], env=env,
                          capture_output=True, text=True, timeout=600)
    out = {"seconds": round(time.perf_counter() - t, 3), "rc": proc.returncode}
    if importtime:
        out.update(importtime_summary(proc.stderr))
    if proc.returncode:
        out["stderr_tail"] = proc.stderr[-600:]
    return out


# Loaded by every Python the probe starts with this dir first on PYTHONPATH: a daemon thread writes every
# thread's stack to a file every few seconds, so a start that waits shows where it waits. A Python thread
# under the GIL, not faulthandler's watchdog: that one reads other threads' frames without it, and the
# Prefect server died of SIGSEGV under it here.
STACKS_SITECUSTOMIZE = """import os
if os.environ.get("EAGLE3_STACKS_FILE"):
    import sys, threading, time, traceback

    def _sample(path=os.environ["EAGLE3_STACKS_FILE"], every=float(os.environ.get("EAGLE3_STACKS_EVERY", "2"))):
        me, main = threading.get_ident(), threading.main_thread().ident
        with open(path, "a") as fh:
            while True:
                time.sleep(every)
                out = [f"Sample (every {every} s)"]
                for tid, frame in sys._current_frames().items():
                    if tid == me:
                        continue
                    out.append(f"{'Main' if tid == main else ''}Thread 0x{tid:016x} (most recent call first):")
                    out += [f'  File "{f.filename}", line {f.lineno} in {f.name}'
                            for f in reversed(traceback.extract_stack(frame))]
                fh.write("\\n".join(out) + "\\n")
                fh.flush()

    threading.Thread(target=_sample, name="eagle3-stacks", daemon=True).start()
"""


def stack_summary(text: str, top: int = 12) -> dict:
    """The sampler's dumps -> how many there were, the innermost frame of every thread and the main
    thread's innermost three, most seen first."""
    counts: dict[str, int] = defaultdict(int)
    main_counts: dict[str, int] = defaultdict(int)  # the main thread's innermost 3 frames: what it waits in
    dumps, innermost_next, main_frames = 0, False, None
    for line in text.splitlines() + ["Sample (end)"]:
        if line.startswith(("Sample (", "Thread 0x", "MainThread 0x")):
            if main_frames:
                main_counts[" <- ".join(main_frames[:3])] += 1
            main_frames = [] if line.startswith("MainThread") else None
            dumps += line.startswith("Sample (") and line != "Sample (end)"
            innermost_next = not line.startswith("Sample (")
        elif line.strip().startswith("File "):
            if innermost_next:
                counts[line.strip()] += 1
                innermost_next = False
            if main_frames is not None:
                main_frames.append(line.strip())

    def most(c: dict[str, int]) -> dict[str, int]:
        return dict(sorted(c.items(), key=lambda kv: -kv[1])[:top])

    return {"dumps": dumps, "innermost_frames": most(counts), "main_thread": most(main_counts)}


def prefect_server_start(run_dir: Path, stacks_every: float | None = None) -> dict:
    """The run's Prefect server, as `eagle3 run` starts it, until its /health answers; then stopped.
    With stacks_every, the server dumps its threads' stacks that often while it starts."""
    from eagle3.process.services import Supervisor
    from flows.local_server import start_local_server

    sup = Supervisor(run_dir / "state")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "EAGLE3_STACKS_FILE", "EAGLE3_STACKS_EVERY")}
    stacks = run_dir / "prefect-server-stacks.txt"
    if stacks_every:
        site = run_dir / "stacks-site"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(STACKS_SITECUSTOMIZE)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), saved["PYTHONPATH"]) if p)
        os.environ["EAGLE3_STACKS_FILE"], os.environ["EAGLE3_STACKS_EVERY"] = str(stacks), str(stacks_every)
    try:
        t = time.perf_counter()
        proc, _ = start_local_server(sup, run_dir / "logs")
        ready = time.perf_counter() - t
        proc.stop()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out = {"seconds": round(ready, 3)}
    if stacks_every:
        text = stacks.read_text(errors="replace") if stacks.exists() else ""
        last = text[text.rfind("Sample ("):] if "Sample (" in text else ""
        out["stacks"] = {**stack_summary(text), "every_s": stacks_every, "last_dump": last[:12000]}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine-python", help="the engine env's python (vLLM's side); left out: the pack's side only")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="`pass` and the loop only (CI)")
    ap.add_argument("--stacks-every", type=float, default=2.0,
                    help="the Prefect server dumps its stacks this often while it starts (0: never)")
    ap.add_argument("--scratch", type=Path, help="where the Prefect server's database goes (default: the temp dir); "
                                                 "its disk's fsync is what a fresh database's migrations wait on")
    args = ap.parse_args()
    py = sys.executable
    result: dict = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.platform(),
                    "cpus": os.cpu_count(), "python": platform.python_version(), "steps": {}}
    if args.smoke:
        result["smoke"] = "`pass` and the loop only: not a measurement"
    steps = result["steps"]

    def step(name: str, value: dict) -> None:  # written as it goes: a probe stopped by a deadline keeps what it had
        steps[name] = value
        print(f"{value['seconds']:8.2f} s  {name}" + (f"  (rc {value['rc']})" if value.get("rc") else ""), flush=True)
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")

    for rep in (1, 2):
        step(f"python -c pass #{rep}", timed([py, "-c", "pass"]))
    loop = subprocess.run([py, "-c", LOOP], capture_output=True, text=True, check=True)
    step("pure-Python loop, 1e7 adds", {"seconds": round(float(loop.stdout), 3)})
    if not args.smoke:
        for rep in (1, 2):
            step(f"import prefect.server.api.server #{rep}", timed([py, "-c", "import prefect.server.api.server"],
                                                                   importtime=True))
        with tempfile.TemporaryDirectory(dir=args.scratch) as d:
            # A fresh database first (a bare machine's first run: Prefect migrates it), then the same one
            # (every later run of that user: ~/.prefect unless PREFECT_HOME says otherwise).
            os.environ["PREFECT_HOME"] = str(Path(d) / "prefect-home")
            for rep in (1, 2):
                step(f"the run's Prefect server to /health #{rep}",
                     prefect_server_start(Path(d), args.stacks_every or None))
        if args.engine_python:
            for rep in (1, 2):
                step(f"engine: import torch #{rep}", timed([args.engine_python, "-c", "import torch"], importtime=True))
            for rep in (1, 2):
                step(f"engine: import vllm.entrypoints.openai.api_server #{rep}", timed(
                    [args.engine_python, "-c", "import vllm.entrypoints.openai.api_server"], importtime=True))
    return 0 if all(not s.get("rc") for s in steps.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
