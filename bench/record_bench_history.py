"""What produced tests/fixtures/bench-history/: the bench phase run twice, back to back, on vLLM CPU
with the trained tiny drafter fixture (tests/fixtures/eagle3-tiny) on its target: baseline + k in
{1, 3}, concurrency {1, 4}, 16 held-out prompts (rows 65-80 of configs/prompts/tiny-prompts.jsonl,
never trained on), 64 greedy tokens. The second run re-measures every server (a forced rerun), so the
two history files are two real measurements of the same setup: what a stable scheduled rerun gives.

    .venv/bin/python bench/record_bench_history.py OUT_DIR     # then copy OUT_DIR/history/*.json
    .venv/bin/python bench/record_bench_history.py OUT_DIR --smoke   # CI: one run of baseline + k=1, 2
                                                                     # prompts of 8 tokens; nothing to copy
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from eagle3.phases.bench import BenchPaths, run_bench  # noqa: E402
from eagle3.phase_runner import supervisor  # noqa: E402
from tests.conftest import write_tiny_config  # noqa: E402
from tests.ports import free_port  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "eagle3-tiny"


def main(out: Path, smoke: bool = False) -> None:
    out.mkdir(parents=True, exist_ok=True)
    bench = {"server": {"port": free_port()}, "drafter": str(FIXTURE / "drafter-trained"), "drafter_trained": True,
             "num_speculative_tokens": [1, 3], "concurrency": [1, 4], "num_prompts": 16, "max_tokens": 64,
             "warmup_prompts": 2, "temperature": 0.0}
    if smoke:  # the script's own path through the phase, at the smallest size that still measures
        bench |= {"num_speculative_tokens": [1], "concurrency": [1], "num_prompts": 2, "max_tokens": 8,
                  "warmup_prompts": 0, "drafter_trained": False, "parity": {"enabled": False}}
    cfg = write_tiny_config(out, {"target": {"model": str(FIXTURE / "target")}, "bench": bench})
    for n in (1,) if smoke else (1, 2):
        shutil.rmtree(BenchPaths.of(cfg).servers, ignore_errors=True)  # re-measure every server
        summary = run_bench(cfg, supervisor(cfg)).details
        print(f"run {n}: {summary['history']} gate {summary['gate']}", flush=True)
    shutil.copytree(BenchPaths.of(cfg).history, out / "history", dirs_exist_ok=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), smoke="--smoke" in sys.argv[2:])
