"""Datagen fanned out over 2 nodes versus on 1, side by side in one run (docs/fanout.md).

Both sides run `eagle3 run CONFIG --only datagen --no-doctor` on the same prompts with the same
settings (greedy, the tiny CPU target), against the same Prefect server: once without a `fanout`
section (one server, this node),
once with `fanout: {shards: {datagen: 2}}` over two node pools, each with a worker. Wall time is
the command's, server starts included: what a user waits for.

    .venv/bin/python bench/fanout_bench.py                       # starts a Prefect server and 2 workers
    .venv/bin/python bench/fanout_bench.py --api-url URL --pools node-a,node-b   # existing ones
    .venv/bin/python bench/fanout_bench.py --smoke ...           # CI: the stand-in engine, not a measurement

On this 2-core box both "nodes" share the same two cores, so two shards cannot be twice as fast:
the design target is linear in nodes (each node its own GPUs); this box shows the overhead of
fanning out and whatever overlap two servers get from two cores. Prints one JSON object.
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
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.conftest import write_tiny_config  # noqa: E402  (the tests' tiny config: free ports, private shm)
from tests.flows.flowkit import WORKER_STOP, base_env, stop_groups, wait_until  # noqa: E402

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
PREFECT = str(Path(sys.executable).parent / "prefect")


def _start(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


NODE_PORT_STEP = 100  # node i adds NODE_PORT_STEP * i to every server port (own nodes; EAGLE3_PORT_OFFSET)


def own_nodes(home: Path, pools: list[str], started: list) -> str:
    """A `prefect server` on a free port, the pools (process, limit 1) and a worker each, as two nodes."""
    import httpx

    from tests.ports import free_port

    url = f"http://127.0.0.1:{free_port()}/api"
    env = base_env() | {"PREFECT_HOME": str(home), "PREFECT_API_URL": url, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                          "PREFECT_UI_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1"}
    started.append(_start([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", url.split(":")[2].split("/")[0],
                           "--no-ui", "--analytics-off"], env, home / "server.log"))

    def healthy():
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, 300, "the Prefect server", step=0.5)
    for i, pool in enumerate(pools):
        for args in (["create", pool, "--type", "process"], ["set-concurrency-limit", pool, "1"]):
            subprocess.run([PREFECT, "work-pool", *args], env=env, check=True, capture_output=True, timeout=120)
        locks = home / f"locks-{i}"
        locks.mkdir(exist_ok=True)
        log = home / f"worker-{i}.log"
        started.append(_start([PREFECT, "worker", "start", "--pool", pool, "--type", "process"],
                              env | {"EAGLE3_LOCK_DIR": str(locks), "EAGLE3_PORT_OFFSET": str(NODE_PORT_STEP * i)}, log))
        wait_until(lambda: "started!" in log.read_text(), 120, f"the worker of {pool}")
    return url


def timed_datagen(directory: Path, overrides: dict, env: dict, nodes: int) -> dict:
    directory.mkdir(parents=True)
    cfg = write_tiny_config(directory, {"name": f"fanout-bench-{directory.name}", **overrides},
                            port_offsets=tuple(NODE_PORT_STEP * i for i in range(nodes)))
    t0 = time.monotonic()
    res = subprocess.run([EAGLE3, "run", str(directory / "config.yaml"), "--only", "datagen", "--no-doctor"], env=env,
                         cwd=REPO, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        sys.exit(f"eagle3 run failed ({res.returncode}) in {directory}:\n{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
    rows = [json.loads(line) for line in cfg.layout.samples.read_text().splitlines() if line.strip()]
    return {"wall_s": round(wall, 1), "samples": len(rows), "ids": sorted(r["id"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api-url", help="an existing Prefect server whose --pools have a worker each")
    ap.add_argument("--pools", default="eagle3-bench-node-a,eagle3-bench-node-b")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, help="also write the JSON here (bench/results/...)")
    ap.add_argument("--smoke", action="store_true", help="4 prompts on the tests' stand-in engine (instant servers): "
                                                         "checks the harness, measures nothing")
    args = ap.parse_args(argv)
    prompts, tokens = (4, 8) if args.smoke else (args.prompts, args.max_tokens)
    pools = [p for p in args.pools.split(",") if p]
    datagen = {"max_samples": prompts, "concurrency": 8,
               "sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": tokens, "seed": 0}}
    started: list = []
    with tempfile.TemporaryDirectory(prefix="eagle3-fanout-bench-") as tmp:
        if args.smoke:
            from tests.reliability.standins import fake_engine_venv

            python = str(fake_engine_venv(Path(tmp) / "standin-venv"))
            datagen["engine"] = "vllm"
            engines = {"engines": {"vllm": {"python": python, "env": {"STANDIN_MODE": "ok"}}}}
        else:
            engines = {}
        try:
            if args.api_url:
                url = args.api_url
            else:
                (Path(tmp) / "prefect").mkdir()
                url = own_nodes(Path(tmp) / "prefect", pools, started)
            # Both sides on the same Prefect server: only the fan-out differs.
            one = timed_datagen(Path(tmp) / "one-node", {"datagen": datagen, **engines},
                                base_env() | {"PREFECT_API_URL": url}, len(pools))
            two = timed_datagen(Path(tmp) / "two-nodes", {"datagen": datagen, **engines, "fanout": {
                "pools": pools, "shards": {"datagen": 2}, "poll_interval_s": 1.0}}, base_env() | {"PREFECT_API_URL": url},
                len(pools))
        finally:
            stop_groups(started, WORKER_STOP)  # the workers end on their second signal
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, {platform.machine()}, no GPU (CPU vLLM)",
        "prompts": prompts, "max_tokens": tokens, "greedy": True,
        "one_node_s": one["wall_s"], "two_shards_s": two["wall_s"],
        "ratio_two_over_one": round(two["wall_s"] / one["wall_s"], 3) if one["wall_s"] else None,
        "same_ids": one["ids"] == two["ids"], "samples": [one["samples"], two["samples"]],
        "note": "both nodes share this box's cores (two workers, one host): not the linear-in-nodes design target",
    }
    if args.smoke:
        result["smoke"] = "4 prompts on the stand-in engine: a harness check, not a measurement"
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["same_ids"] and one["samples"] == prompts else 1


if __name__ == "__main__":
    sys.exit(main())
