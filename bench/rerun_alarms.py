"""Scheduled benchmark reruns through the deployment a cron schedule runs: do they cry wolf, and do they
catch a worse drafter (issue 54)?

Real parts only: `prefect server start`, the process pool gpu-node-0 with `prefect worker start` on it, the
deployments of deployments/prefect.yaml (`prefect deploy --all`), and each rerun a flow run of the
eagle3-benchmark deployment: vLLM's CPU build serving the real SmolLM2-135M-Instruct (`make demo` makes it)
with a copy of the drafter the pack ships for it, baseline and k=3 up at once, 3 paired windows, 8 held-out
prompts, 64 greedy tokens. One run dir, one bench history; the watch judges each rerun against the runs
before it (eagle3/bench/watch.py):

  1          the drafter as shipped                                  the first baseline
  2 .. N+1   the drafter as shipped, N times (--reruns, 10)          a failed flow run here is a false alarm
  N+2        a drafter with lower acceptance (noise on its lm_head)  a drafter regression, the flow run fails

    .venv/bin/python bench/rerun_alarms.py --out bench/results/rerun-alarms-cpu-DATE.json \\
        --history-out bench/results/rerun-alarms-cpu-DATE-history
    .venv/bin/python bench/rerun_alarms.py --reruns 1 --out /tmp/r.json    # one rerun, then the worse drafter
    .venv/bin/python bench/rerun_alarms.py --rejudge HISTORY --out FILE    # this checkout's watch on a recorded
                                                                           # history, run by run
A throttled node (--steps, e.g. first,throttled,rerun,rerun,rerun,throttled): during a "throttled" run the
worker, and so every process of its flow run (the servers, the load generator), sits in a CPU cgroup capped
at --throttle-cpus CPUs (default 1.0 of this box's 2), as a container runtime's CPU limit caps a node; the
worker is moved back and the cgroup removed after the run. Nothing the pack records changes, so the watch
may only call it node drift, and judge it on absolute figures once 3 earlier runs give its between-run
noise. (A first try, a process spinning on each CPU pinned to it, slowed nothing: vLLM's CPU build kept
its core, bench/results/rerun-alarms-cpu-20261206-slowed/.) Needs a writable cgroup cpu controller (root).

Exit 0 when no normal rerun failed its flow run and the worse drafter failed its flow run as a drafter
regression; 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.derive_profile import derive  # noqa: E402
from eagle3.bench.watch import read_history, watch  # noqa: E402
from eagle3.drafters.shipped import STAMP, ensure_installed  # noqa: E402
from eagle3.fsio import atomic_write_json  # noqa: E402
from tests.ports import free_port  # noqa: E402

PREFECT = str(Path(sys.executable).parent / "prefect")
POOL, DEPLOYMENT = "gpu-node-0", "eagle3-benchmark/gpu-node-0"
SIGMA = 0.17  # noise on the lm_head, in units of each row's standard deviation: 0.12, 0.18, 0.3 took the shipped
# drafter's held-out acceptance from 2.64 to 2.58, 2.48, 2.31 (one window each, this box, 2026-12-06)


STEPS = {"first": ("first", None), "rerun": ("rerun {n}", None), "throttled": ("node throttled {n}", "throttled"),
         "worse": ("worse drafter", "perturbed")}  # a step of --steps: its label, and what it changes
CGROUP = Path("/sys/fs/cgroup")


def prefect_env(home: Path, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env | {"PREFECT_HOME": str(home), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
                  "PREFECT_WORKER_QUERY_SECONDS": "1", "EAGLE3_REPO": str(REPO)}


def start(argv: list[str], env: dict, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)


def stop(proc: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM to the group this script started, then SIGKILL after `grace`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_for(what: str, check, timeout: float) -> None:
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            sys.exit(f"rerun_alarms: {what} not within {timeout:.0f} s")
        time.sleep(1)


def serve(work: Path) -> tuple[dict, list[subprocess.Popen]]:
    """The Prefect server, the pool, the deployments and a worker, as an operator sets a node up."""
    import httpx

    home, port = work / "prefect-home", free_port()
    home.mkdir(parents=True, exist_ok=True)
    env = prefect_env(home, port)
    server = start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port), "--no-ui",
                    "--analytics-off"], env, home / "server.log")

    def healthy() -> bool:
        if server.poll() is not None:
            sys.exit(f"rerun_alarms: prefect server exited; see {home / 'server.log'}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=2).status_code == 200
        return False

    wait_for("the Prefect server", healthy, 300)
    for argv in ([PREFECT, "work-pool", "create", POOL, "--type", "process"],
                 [PREFECT, "work-pool", "set-concurrency-limit", POOL, "1"],
                 [PREFECT, "deploy", "--all", "--prefect-file", "deployments/prefect.yaml"]):
        subprocess.run(argv, env=env, cwd=REPO, check=True, capture_output=True, timeout=600)
    worker = start([PREFECT, "worker", "start", "--pool", POOL, "--type", "process"], env, home / "worker.log",
                   cwd=work)
    wait_for("the worker", lambda: "started!" in (home / "worker.log").read_text(), 120)
    return env, [worker, server]


def rerun(env: dict, config: Path, timeout: float = 1800) -> dict:
    """One flow run of the benchmark deployment, as its schedule creates one; its final state."""
    code = ("import json, sys, time\nfrom prefect.client.orchestration import get_client\n"
            "with get_client(sync_client=True) as c:\n"
            f"    dep = c.read_deployment_by_name({DEPLOYMENT!r})\n"
            "    run = c.create_flow_run_from_deployment(dep.id, parameters={'config_path': sys.argv[1]})\n"
            "    t0 = time.monotonic()\n"
            "    while not (run := c.read_flow_run(run.id)).state.is_final() and time.monotonic() - t0 < float(sys.argv[2]):\n"
            "        time.sleep(2)\n"
            "    print(json.dumps({'state': run.state.name, 'message': run.state.message, 'id': str(run.id)}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(config), str(timeout)], env=env, check=True,
                         capture_output=True, text=True, timeout=timeout + 120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def throttled(worker: int, cpus: float):
    """`worker` (this script's own child) and all it starts meanwhile in a new CPU cgroup capped at `cpus`
    CPUs, for the block; then every process in that cgroup (the worker and what is left of its children,
    all ours) is moved back to the root cgroup and the cgroup removed."""
    v2 = (CGROUP / "cgroup.controllers").is_file()
    root = CGROUP if v2 else CGROUP / "cpu"
    group = root / f"eagle3-rerun-alarms-{os.getpid()}"
    group.mkdir()
    try:
        period = 100_000
        if v2:
            (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
        (group / "cgroup.procs").write_text(str(worker))
        yield
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, OSError):  # exited since the read
                (root / "cgroup.procs").write_text(pid)
        group.rmdir()


def perturbed(drafter: Path, sigma: float) -> None:
    """The drafter's lm_head plus Gaussian noise (seeded), written in place: a retrain that came out worse."""
    code = ("import sys, torch\nfrom safetensors.torch import load_file, save_file\n"
            "path, sigma = sys.argv[1], float(sys.argv[2])\nt = load_file(path)\nw = t['lm_head.weight'].float()\n"
            "g = torch.Generator().manual_seed(0)\n"
            "t['lm_head.weight'] = (w + torch.randn(w.shape, generator=g) * w.std(dim=1, keepdim=True) * sigma)"
            ".to(torch.bfloat16)\nsave_file(dict(sorted(t.items())), path, metadata={'format': 'pt'})\n")
    subprocess.run([str(REPO / ".venv-engine" / "bin" / "python"), "-c", code, str(drafter / "model.safetensors"),
                    str(sigma)], check=True, timeout=600)


def verdict(run_dir: Path) -> dict:
    """The watch's verdict on the newest history entry, with the figures an operator looks at first."""
    name, last = read_history(run_dir / "bench-history")[-1]
    w, figs = last.get("watch") or {}, (last.get("watch") or {}).get("figures") or {}
    pick = lambda key, fig: (figs.get(key) or {}).get(fig) or {}  # noqa: E731
    return {"history_file": name, "watch": w.get("status"), "watch_message": w.get("message"),
            "baseline_tok_s": pick("k0-c1", "output_tok_s"), "speedup": pick("k3-c1", "speedup"),
            "acceptance_length": pick("k3-c1", "acceptance_length"), "detectable": w.get("detectable")}


def rejudge(history: Path) -> list[dict]:
    """This checkout's watch on a recorded history, run by run, each against the verdicts before it (the
    measurements as recorded; only the judging is redone)."""
    judged: list[tuple[str, dict]] = []
    out = []
    for name, results in read_history(history):
        as_run = (results.get("watch") or {}).get("status")
        results = {k: v for k, v in results.items() if k != "watch"}
        results["watch"] = watch(results, judged)
        judged.append((name, results))
        out.append({"history_file": name, "as_run": as_run, "status": results["watch"]["status"],
                    "message": results["watch"]["message"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reruns", type=int, default=10, help="normal reruns before the worse drafter")
    ap.add_argument("--out", type=Path, required=True, help="the record (JSON)")
    ap.add_argument("--history-out", type=Path, help="copy the run dir's bench history here (raw files)")
    ap.add_argument("--work", type=Path, help="scratch dir (default: a new temp dir, removed at the end)")
    ap.add_argument("--rejudge", type=Path, metavar="HISTORY", help="only judge a recorded history again")
    ap.add_argument("--steps", help="the runs, in order, from: first, rerun, throttled (the worker's flow run in a "
                                    "CPU cgroup), worse (the worse drafter); default: first, --reruns reruns, worse")
    ap.add_argument("--throttle-cpus", type=float, default=1.0, help="the CPU cap of a throttled run")
    args = ap.parse_args(argv)
    if args.rejudge:
        verdicts = rejudge(args.rejudge)
        atomic_write_json(args.out, {"history": str(args.rejudge), "verdicts": verdicts})
        for v in verdicts:
            print(f"{v['history_file']}: {v['as_run']} -> {v['status']}")
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="rerun-alarms-"))
    shipped, _ = ensure_installed("smollm2-135m-h200", REPO / "models" / "drafters" / "smollm2-135m-h200")
    drafter = work / "drafter"  # "the latest trained drafter" of this setup: a copy a retrain may replace
    shutil.copytree(shipped, drafter, dirs_exist_ok=True)
    (drafter / STAMP).unlink(missing_ok=True)
    config = derive(REPO / "configs" / "smollm2-cpu.yaml", "rerun-alarms", [
        f"run_dir={work / 'run'}", f"bench.drafter={drafter}", "bench.drafter_trained=true", "bench.windows=3",
        "bench.concurrency=[1]", 'bench.parity={"enabled": false}'])
    steps = args.steps.split(",") if args.steps else ["first", *["rerun"] * args.reruns, "worse"]
    if unknown := sorted(set(steps) - set(STEPS)):
        ap.error(f"--steps: unknown step(s) {unknown}; choose from {', '.join(STEPS)}")
    plan = [(STEPS[s][0].format(n=steps[:i + 1].count(s)), STEPS[s][1]) for i, s in enumerate(steps)]
    env, procs = serve(work)
    runs = []
    try:
        for label, change in plan:
            if change == "perturbed":
                perturbed(drafter, SIGMA)
            t0 = time.monotonic()
            with throttled(procs[0].pid, args.throttle_cpus) if change == "throttled" else contextlib.nullcontext():
                state = rerun(env, config)
            runs.append({"label": label, "change": change, "seconds": round(time.monotonic() - t0, 1), **state,
                         **verdict(work / "run")})
            print(f"{label}: {state['state']}, watch {runs[-1]['watch']}: {runs[-1]['watch_message']}", flush=True)
    finally:
        for proc in procs:
            stop(proc)
        # A flow run the worker's stop cut short leaves its servers behind, as a crashed node would: the
        # pack's own recovery handoff ends what its run dir's registry names (by PID, start time, owner token).
        subprocess.run([str(Path(sys.executable).parent / "eagle3"), "handoff", str(config)], cwd=REPO,
                       capture_output=True, timeout=300)
    normal = [r for r in runs if r["label"].startswith("rerun ")]
    alarms = [r for r in normal if r["state"] != "Completed"]
    checks = {"no false alarm": len(alarms) == 0}
    worse = [r for r in runs if r["change"] == "perturbed"]
    if worse:
        checks["worse drafter caught"] = all(r["watch"] == "drafter regression" and r["state"] == "Failed" for r in worse)
    slowed = [r for r in runs if r["change"] == "throttled"]
    if slowed:  # the node's fault: nothing recorded changed, so never a regression of the drafter or the engine
        checks["throttled node never blamed"] = all(r["watch"] not in ("drafter regression", "engine regression")
                                                    and r["state"] == "Completed" for r in slowed)
    record = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": os.uname().nodename,
              "cpus": os.cpu_count(), "config": str(config.relative_to(REPO)), "sigma": SIGMA, "throttle_cpus": args.throttle_cpus,
              "normal_reruns": len(normal), "false_alarms": len(alarms), "checks": checks, "runs": runs}
    atomic_write_json(args.out, record)
    if args.history_out:
        shutil.copytree(work / "run" / "bench-history", args.history_out, dirs_exist_ok=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(checks))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
