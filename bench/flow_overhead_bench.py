"""Flow overhead: the pipeline flow against a running Prefect server versus the same work called
directly (no Prefect), with the no-op phases of tests/flows/noop_phases.py.

Both sides do the same work on a fresh run dir each repetition: the five GPU handoffs (before the
first phase, between each two, after the last) and the four phase bodies through
eagle3.phase_runner.run_phase (DONE markers, fingerprints). The flow adds what Prefect costs: flow and
task runs on the server, result persistence and cache records, artifacts, logs. The preflight
doctor is off on both sides (it probes real engines).

    .venv/bin/python bench/flow_overhead_bench.py              # starts its own `prefect server start`
    .venv/bin/python bench/flow_overhead_bench.py --api-url http://127.0.0.1:4200/api --reps 5

    .venv/bin/python bench/flow_overhead_bench.py --smoke      # CI: one rep, the budget not judged
Budget: overhead <= 5 s per pipeline run (exit 1 if the median is over).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "flows"))
sys.path.insert(0, str(REPO))
import noop_phases  # noqa: E402
from tests.ports import free_port  # noqa: E402

os.environ.update(noop_phases.overrides_env())  # before eagle3.phase_runner is imported
BUDGET_S = 5.0


def start_server(home: Path) -> tuple[subprocess.Popen, str, float]:
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    log = open(home / "server.log", "ab")
    t0 = time.monotonic()
    proc = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(port), "--no-ui", "--analytics-off"], env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    while time.monotonic() - t0 < 300:
        if proc.poll() is not None:
            sys.exit(f"prefect server exited with {proc.returncode}; see {home / 'server.log'}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(proc)
    sys.exit("prefect server did not become healthy in 300 s")


def stop_server(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)  # the group this script started
        except ProcessLookupError:
            break
        try:
            proc.wait(wait_s)
            break
        except subprocess.TimeoutExpired:
            pass


def direct(config_path: Path, with_handoffs: bool = True) -> float:
    """The same work without Prefect: handoffs and phase bodies called as plain functions."""
    from eagle3.config import load_config
    from eagle3.phase_table import names
    from eagle3.handoff.core import handoff_for_config
    from eagle3.phase_runner import run_phase

    t0 = time.perf_counter()
    cfg = load_config(config_path)
    if with_handoffs:
        handoff_for_config(cfg, after="start")
    for phase in names():
        run_phase(cfg, phase)
        if with_handoffs:
            handoff_for_config(cfg, after=phase)
    return time.perf_counter() - t0


def via_flow(config_path: Path) -> float:
    from flows.pipeline import eagle3_pipeline

    t0 = time.perf_counter()
    state = eagle3_pipeline(config_path=str(config_path), doctor=False, return_state=True)
    took = time.perf_counter() - t0
    if not state.is_completed():
        sys.exit(f"flow run ended {state.name}: {state.message}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api-url", help="use this running server instead of starting one")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each side (fresh run dir each)")
    ap.add_argument("--smoke", action="store_true", help="one repetition; reported, not judged (a loaded CI box)")
    args = ap.parse_args()
    if args.smoke:
        args.reps = 1

    work = Path(tempfile.mkdtemp(prefix="eagle3-overhead-"))
    home = work / "prefect-home"
    home.mkdir()
    proc, startup = None, None
    try:
        if args.api_url:
            url = args.api_url
        else:
            proc, url, startup = start_server(home)
        os.environ |= {"PREFECT_API_URL": url, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_LOGGING_LEVEL": "WARNING"}
        t0 = time.perf_counter()
        import flows.pipeline  # noqa: F401  (Prefect and the flow module: a one-off per process)
        import_s = time.perf_counter() - t0

        rows = []
        for i in range(args.reps):
            cfgs = [noop_phases.write_noop_config(work / f"rep{i}-{side}", name=f"overhead-{i}-{side}")
                    for side in ("bare", "direct", "flow")]
            bare = direct(cfgs[0], with_handoffs=False)
            d = direct(cfgs[1])
            f = via_flow(cfgs[2])
            for phase, n in noop_phases.counts(cfgs[2].parent / "run").items():
                assert n == 1, f"flow rep {i}: {phase} body ran {n} times"
            rows.append((bare, d, f))
            print(f"rep {i + 1}: phases only {bare:6.2f} s | direct (phases + handoffs) {d:6.2f} s | "
                  f"flow {f:6.2f} s | overhead {f - d:+6.2f} s", flush=True)
    finally:
        if proc is not None:
            stop_server(proc)
        shutil.rmtree(work, ignore_errors=True)

    med = [statistics.median(col) for col in zip(*rows)]
    first_overhead = rows[0][2] - rows[0][1]
    overhead = statistics.median(f - d for _, d, f in rows)
    print()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"load avg {' '.join(f'{x:.1f}' for x in os.getloadavg())}, Python {platform.python_version()}")
    import prefect

    print(f"prefect {prefect.__version__}; server {'given' if args.api_url else f'started here, healthy after {startup:.1f} s'}"
          f"; import of prefect + flow module {import_s:.1f} s (not counted)")
    print(f"median of {args.reps}:  direct {med[1]:.2f} s   flow {med[2]:.2f} s   overhead {overhead:+.2f} s "
          f"(first run {first_overhead:+.2f} s; phases alone {med[0]:.2f} s)   budget {BUDGET_S:.0f} s: "
          f"{'OK' if overhead <= BUDGET_S else 'OVER'}{' (smoke: not judged)' if args.smoke else ''}")
    return 0 if overhead <= BUDGET_S or args.smoke else 1


if __name__ == "__main__":
    sys.exit(main())
