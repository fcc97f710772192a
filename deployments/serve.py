"""Single-host alternative to the work pool: serve the full pipeline (run by hand) and the
benchmark rerun (on a cron schedule) from one long-lived process that runs at most one flow run
at a time (`limit=1`: the GPU lease on this host).

    prefect server start                                   # in another shell; schedules need the real server
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python deployments/serve.py --config configs/tiny-cpu.yaml --cron "0 3 * * *"
    prefect deployment run eagle3-pipeline/serve           # a full pipeline run

Use either this or a worker on the node's pool, never both on one node: the limit of a served
process and the pool's limit do not know about each other. Ctrl-C / SIGTERM pauses the schedules and
exits.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def build(config: str, cron: str | None, name: str = "serve", timezone: str = "UTC") -> list:
    from prefect.schedules import Cron

    from flows.benchmark import eagle3_benchmark
    from flows.pipeline import eagle3_pipeline

    params = {"config_path": str(Path(config).resolve())}
    pipeline = eagle3_pipeline.to_deployment(name=name, parameters=params, tags=["eagle3", "gpu", "serve"],
                                             description="Full EAGLE-3 pipeline; run by hand.")
    bench = eagle3_benchmark.to_deployment(name=name, parameters=params, tags=["eagle3", "gpu", "serve"],
                                           description="Benchmark rerun against the latest trained drafter.",
                                           schedules=[Cron(cron, timezone=timezone)] if cron else None)
    return [pipeline, bench]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny-cpu.yaml", help="pipeline config (relative: to the repo root)")
    ap.add_argument("--cron", default="0 3 * * *", help="benchmark rerun schedule; '' for none")
    ap.add_argument("--timezone", default="UTC")
    ap.add_argument("--name", default="serve", help="deployment name of both flows")
    args = ap.parse_args(argv)
    if not os.environ.get("PREFECT_API_URL"):
        print("error: PREFECT_API_URL is not set. Schedules need a real server (the embedded one has no scheduler):\n"
              "  prefect server start  &&  export PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 2
    os.chdir(REPO)  # entrypoints (flows/*.py) and relative config paths resolve against the repo root
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect import serve

    serve(*build(args.config, args.cron or None, args.name, args.timezone), limit=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
