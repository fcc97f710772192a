"""Stand-in for `vllm.benchmarks.serve`: parses the flags the pack passes and writes a result file
of the real client's shape. FAKE_BENCH_FAIL_ON_CALL=n raises on the n-th call of this process;
FAKE_BENCH_SLEEP=s sleeps s seconds per call. Each call appends this PID to FAKE_BENCH_CALLS."""

import json
import os
import time
from pathlib import Path

_calls = [0]


def add_cli_args(parser):
    for flag in ("--backend", "--endpoint", "--base-url", "--model", "--served-model-name", "--tokenizer",
                 "--dataset-name", "--dataset-path", "--custom-output-len", "--num-prompts", "--max-concurrency",
                 "--request-rate", "--temperature", "--seed", "--num-warmups", "--ready-check-timeout-sec",
                 "--percentile-metrics", "--metric-percentiles", "--result-dir", "--result-filename"):
        parser.add_argument(flag)
    for flag in ("--skip-chat-template", "--disable-shuffle", "--no-oversample", "--save-result", "--save-detailed",
                 "--disable-tqdm", "--ignore-eos"):
        parser.add_argument(flag, action="store_true")


def main(args):
    _calls[0] += 1
    with open(os.environ["FAKE_BENCH_CALLS"], "a") as f:
        f.write(f"{os.getpid()} {args.max_concurrency}\n")
    time.sleep(float(os.environ.get("FAKE_BENCH_SLEEP", "0")))
    if str(_calls[0]) == os.environ.get("FAKE_BENCH_FAIL_ON_CALL"):
        raise RuntimeError(f"fake client failure on call {_calls[0]}")
    n, out = int(args.num_prompts), int(args.custom_output_len)
    result = {"completed": n, "failed": 0, "duration": 1.0, "total_input_tokens": 10 * n,
              "total_output_tokens": n * out, "request_throughput": float(n), "output_throughput": float(n * out),
              "mean_ttft_ms": 5.0, "mean_tpot_ms": 2.0}
    Path(args.result_dir, args.result_filename).write_text(json.dumps(result))
    print(f"fake bench: {n} requests at concurrency {args.max_concurrency}", flush=True)
    return result
