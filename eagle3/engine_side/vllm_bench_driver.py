"""Runs `vllm bench serve` once per job, all in this one process (started by eagle3.engines.loadgen
with the engine venv's interpreter; it imports nothing of the pack).

vLLM's own benchmark client costs a ~10 s import on a small CPU box, paid again by every
`vllm bench serve` invocation; here it is paid once per server. Each job runs the very function
the CLI runs (`vllm.benchmarks.serve.main`) with the same flags.

Protocol, in the directory given as argv[1]: the jobs are <n>.json = {"argv": [flags]}, taken in
order n = 1, 2, ...; after each, <n>.rc holds its exit status (0, or non-zero after an error, whose
traceback goes to the log), written atomically. The process runs until it is stopped, or exits by
itself once its parent is gone."""

import json
import os
import sys
import time
import traceback
from pathlib import Path


def _wait_for(job: Path, parent: int) -> bool:
    while not job.exists():
        if os.getppid() != parent:  # the orchestrator died; its registry's next sweep would end us anyway
            return False
        time.sleep(0.05)
    return True


def main(jobs: Path) -> int:
    parent = os.getppid()
    t0 = time.monotonic()
    from vllm.benchmarks.serve import add_cli_args, main as bench_main  # the slow part, once
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:  # older layouts; the flags are plain argparse ones
        from argparse import ArgumentParser as Parser
    print(f"vllm bench driver: ready after {time.monotonic() - t0:.1f} s of imports", flush=True)
    n = 1
    while _wait_for(jobs / f"{n}.json", parent):
        argv = json.loads((jobs / f"{n}.json").read_text())["argv"]
        print(f"vllm bench driver: job {n}: vllm bench serve {' '.join(argv)}", flush=True)
        parser = Parser()
        add_cli_args(parser)
        try:
            bench_main(parser.parse_args(argv))
            rc = 0
        except SystemExit as e:  # argparse errors
            rc = e.code if isinstance(e.code, int) and e.code else 2
        except Exception:  # noqa: BLE001 - reported through the rc file and the log
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        tmp = jobs / f".{n}.rc.tmp"
        tmp.write_text(str(rc))
        os.replace(tmp, jobs / f"{n}.rc")
        n += 1
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
