"""What the engines' own load generators are asked (LoadSpec) and what the report reads of a run (LoadResult).

Each engine's module drives its own client (Engine.load_argv, parse_load). All are driven the same
way: a file of held-out prompts, one run per concurrency (in one process per server where the engine
has a driver, eagle3/engines/loadgen.py), the
chat endpoint (so the server applies the same chat template as in data generation), explicit
sampling and output length, no built-in warm-up or ready-check request (the phase warms the
server up itself, outside the measured window, so that the window holds exactly the measured
requests and the server's counter deltas around it belong to them alone).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import CommandFailed


@dataclass(frozen=True)
class LoadSpec:
    base_url: str
    served_name: str
    tokenizer: Path          # the target's model dir (prompt-length counting on the client)
    dataset: Path
    num_prompts: int
    concurrency: int
    max_tokens: int
    temperature: float
    ignore_eos: bool
    result_file: Path
    seed: int = 0


@dataclass
class LoadResult:
    """The numbers the report uses, in one vocabulary whichever client produced them."""

    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float          # tok/s over the window
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_itl_ms: float | None
    mean_e2el_ms: float | None
    client_spec: dict | None          # the client's own acceptance numbers, if it printed any
    raw_file: str
    # Per request (vLLM's client, --save-detailed): {"output_tokens", "ttft_ms", "latency_ms", "chunks"} of
    # each completed request; the benchmark watch bootstraps its noise intervals from them.
    requests: list[dict] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def read_result_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CommandFailed(f"the benchmark client exited 0 but wrote no result file {path}") from None
