"""The engines' own load generators: `vllm bench serve` and SGLang's `python -m sglang.bench_serving`.

Both are driven the same way: a file of held-out prompts, one run per concurrency (vLLM's in one
process per server, eagle3/engines/loadgen.py), the
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
from ..fsio import atomic_write_text


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


# ---- datasets ----------------------------------------------------------------------------------

def write_vllm_dataset(path: Path, prompts: list[str]) -> Path:
    """vLLM's `custom` dataset: one {"prompt": ...} per line (a single user turn)."""
    atomic_write_text(path, "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts))
    return path


def write_sglang_dataset(path: Path, prompts: list[str]) -> Path:
    """ShareGPT layout; the second turn is a placeholder, --sharegpt-output-len sets the length."""
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "-"}]}
            for i, p in enumerate(prompts)]
    atomic_write_text(path, json.dumps(rows, ensure_ascii=False))
    return path


# ---- vLLM --------------------------------------------------------------------------------------

def vllm_flags(s: LoadSpec) -> list[str]:
    """The flags of `vllm bench serve` (also what eagle3/engine_side/vllm_bench_driver.py parses)."""
    argv = [  # The chat backend: the server renders its own chat template, as it did for data generation.
            "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", s.base_url, "--model", str(s.tokenizer), "--served-model-name", s.served_name,
            "--tokenizer", str(s.tokenizer),
            "--dataset-name", "custom", "--dataset-path", str(s.dataset),
            # The prompt goes to the server as a user message; templating it here as well would nest it.
            "--skip-chat-template", "--disable-shuffle", "--no-oversample",
            "--custom-output-len", str(s.max_tokens), "--num-prompts", str(s.num_prompts),
            "--max-concurrency", str(s.concurrency), "--request-rate", "inf",
            "--temperature", str(s.temperature), "--seed", str(s.seed),
            # No request of the client's own outside the measured window (see the module docstring).
            "--num-warmups", "0", "--ready-check-timeout-sec", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(s.result_file.parent), "--result-filename", s.result_file.name,
            "--disable-tqdm"]
    return argv + (["--ignore-eos"] if s.ignore_eos else [])


def parse_vllm(path: Path) -> LoadResult:
    r = _read_json(path)
    spec = None
    if "spec_decode_num_drafts" in r:
        spec = {"drafts": r["spec_decode_num_drafts"], "draft_tokens": r["spec_decode_draft_tokens"],
                "accepted": r["spec_decode_accepted_tokens"],
                "acceptance_rate": r["spec_decode_acceptance_rate"] / 100.0,  # the client prints percent
                "acceptance_length": r["spec_decode_acceptance_length"],
                "per_position": list(r.get("spec_decode_per_position_acceptance_rates") or [])}
    return LoadResult(
        completed=int(r["completed"]), failed=int(r.get("failed", 0)), duration_s=float(r["duration"]),
        total_input_tokens=int(r["total_input_tokens"]), total_output_tokens=int(r["total_output_tokens"]),
        request_throughput=float(r["request_throughput"]), output_throughput=float(r["output_throughput"]),
        mean_ttft_ms=r.get("mean_ttft_ms"), median_ttft_ms=r.get("median_ttft_ms"), p99_ttft_ms=r.get("p99_ttft_ms"),
        mean_tpot_ms=r.get("mean_tpot_ms"), median_tpot_ms=r.get("median_tpot_ms"), p99_tpot_ms=r.get("p99_tpot_ms"),
        mean_itl_ms=r.get("mean_itl_ms"), mean_e2el_ms=r.get("mean_e2el_ms"), client_spec=spec, raw_file=str(path),
        requests=_vllm_requests(r))


def _vllm_requests(r: dict) -> list[dict] | None:
    """The completed requests of a --save-detailed result (failed ones have no output tokens)."""
    lens, ttfts, lats, itls, errors = (r.get(k) for k in ("output_lens", "ttfts", "latencies", "itls", "errors"))
    if not all(isinstance(x, list) for x in (lens, ttfts, itls)):
        return None
    if not isinstance(lats, list):
        # vLLM 0.25's client saves no "latencies" (0.32's does): a streamed request's latency is its
        # first token's time plus the gaps to each later chunk, which is what 0.32 records too.
        lats = [t + sum(itl) for t, itl in zip(ttfts, itls)]
    errors = errors if isinstance(errors, list) else [""] * len(lens)
    # chunks: streamed pieces after the first token; with speculation one verify step's tokens
    # arrive as one piece, so output tokens per chunk tracks the request's acceptance length.
    return [{"output_tokens": int(n), "ttft_ms": round(t * 1000, 3), "latency_ms": round(lat * 1000, 3),
             "chunks": len(itl)} for n, t, lat, itl, err in zip(lens, ttfts, lats, itls, errors) if n and not err]


# ---- SGLang ------------------------------------------------------------------------------------

def sglang_argv(env, s: LoadSpec) -> list[str]:
    argv = [*env.python_argv(), "-m", "sglang.bench_serving",
            "--backend", "sglang-oai-chat", "--base-url", s.base_url,
            "--model", s.served_name, "--tokenizer", str(s.tokenizer),
            "--dataset-name", "sharegpt", "--dataset-path", str(s.dataset),
            "--sharegpt-output-len", str(s.max_tokens), "--num-prompts", str(s.num_prompts),
            "--max-concurrency", str(s.concurrency), "--request-rate", "inf",
            # With usage in the stream, its token counts are the server's own (else it counts max_tokens
            # per request), so the window's counts can be matched against the server's counters.
            "--extra-request-body", json.dumps({"temperature": s.temperature, "stream_options": {"include_usage": True}}),
            "--warmup-requests", "0", "--seed", str(s.seed), "--output-file", str(s.result_file)]
    # bench_serving ignores EOS unless told otherwise; vLLM's client is the other way round.
    return argv + ([] if s.ignore_eos else ["--disable-ignore-eos"])


def parse_sglang(path: Path) -> LoadResult:
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise CommandFailed(f"{path}: SGLang's bench_serving wrote no result line")
    r = json.loads(lines[-1])  # the file is appended to; the last line is this run
    spec = {"accept_length": r["accept_length"]} if r.get("accept_length") is not None else None
    return LoadResult(
        completed=int(r["completed"]), failed=int(r.get("num_failed", r.get("failed", 0)) or 0),
        duration_s=float(r["duration"]), total_input_tokens=int(r["total_input_tokens"]),
        total_output_tokens=int(r["total_output_tokens"]), request_throughput=float(r["request_throughput"]),
        output_throughput=float(r["output_throughput"]), mean_ttft_ms=r.get("mean_ttft_ms"),
        median_ttft_ms=r.get("median_ttft_ms"), p99_ttft_ms=r.get("p99_ttft_ms"), mean_tpot_ms=r.get("mean_tpot_ms"),
        median_tpot_ms=r.get("median_tpot_ms"), p99_tpot_ms=r.get("p99_tpot_ms"), mean_itl_ms=r.get("mean_itl_ms"),
        mean_e2el_ms=r.get("mean_e2e_latency_ms"), client_spec=spec, raw_file=str(path))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CommandFailed(f"the benchmark client exited 0 but wrote no result file {path}") from None
