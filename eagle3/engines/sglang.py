"""SGLang: every fact the pack uses about it (eagle3/engines/engine.py lists them). SGLang cannot run
on a CPU-only machine; these follow its documented flags and are exercised on GPU nodes."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..errors import CommandFailed
from ..fsio import atomic_write_text
from ..process.readiness import HttpProbe, LogProbe, Probe
from . import loadgen, metrics
from .loadgen import LoadResult, LoadSpec
from .engine import SPECULATIVE, Engine

READY_LINE = r"The server is fired up and ready to roll!"
LAUNCHER = Path(__file__).resolve().parent.parent / "engine_side" / "sglang_serve.py"
KEY_ENV = "EAGLE3_SERVER_API_KEY"


class Sglang(Engine):
    name = "sglang"
    # SGLang ends its own process tree on SIGTERM to its leader (drain, then kill_process_tree). SIGTERM
    # to the whole group reaches its detokenizer first, which its leader takes for a crash: SIGQUIT, five
    # seconds of crash diagnostics, a log that reads as a failure (seen on the H200, 0.5.16).
    stop_leader_first = True
    # What it leaves in /dev/shm (docs/FACTS.md §6); >= 0.5.16 never unlinks its load snapshots, even on a clean stop.
    shm_patterns = ("sgl_shm_*", "multi_tokenizer_args_*", "shared_mla_tp*", "sglang_loads_*")
    shm_creator_pid = (r"^sgl_shm_[^_]+_(\d+)_", r"^shared_mla_tp\d+_p(\d+)")
    gpu_share_flag = "--mem-fraction-static"
    distributions = ("sglang",)
    inspect_script = "inspect_sglang.py"

    def serve_argv(self, env, target, server, extra: list[str] = ()) -> list[str]:
        argv = [*env.python_argv(), str(LAUNCHER),
                "--model-path", str(target.model),
                "--served-model-name", target.served_name,
                "--host", server.host, "--port", str(server.port),
                "--context-length", str(target.max_model_len),
                "--dtype", target.dtype,
                "--tp-size", str(target.tensor_parallel_size),
                *(["--dp-size", str(target.data_parallel_size)] if target.data_parallel_size > 1 else []),
                "--enable-metrics"]  # the counters the benchmark's windows are measured by (engines/metrics.py)
        if target.trust_remote_code:
            argv.append("--trust-remote-code")
        return argv + list(extra) + list(server.extra_args)

    def serve_env(self, key: str) -> dict[str, str]:
        # SGLang reads its key only from --api-key; the launcher appends it after exec (see there).
        return {KEY_ENV: key}

    def readiness(self, server, log: Path) -> list[Probe]:
        # SGLang answers HTTP (even /v1/models) before warm-up; /health turns 200 after it, and the
        # ready line is printed once the warm-up request has gone through. Require both.
        return [HttpProbe(f"http://{server.host}:{server.port}/health"), LogProbe(log, READY_LINE)]

    start_steps = (
        ("weights_s", r"Load weight end\. elapsed=([\d.]+) s"),
        ("graphs_s", r"Capture (?:[\w ]+ )?(?:cuda|CUDA) graph end\. Time elapsed: ([\d.]+) s"),
    )
    # Its first timestamped line comes once the launcher has imported SGLang and torch.
    start_marks = (("imports_s", r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\]", "%Y-%m-%d %H:%M:%S"),)

    acceptance_source = ("sglang /metrics counter deltas around the window (verify calls, generation tokens, "
                         "requests; no per-position counts)")

    def spec_args(self, drafter: Path, k: int) -> list[str]:
        # EAGLE3, never EAGLE: EAGLE with an EAGLE-3 drafter runs with accept length 1.00 and no error.
        # All three of steps/topk/draft tokens, as SGLang wants; topk 1 + k+1 draft tokens = a chain of k.
        return ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter),
                "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]

    def scrape(self, url, k, served_name, headers, before=True):
        spec, traffic = read_counters(url, k, served_name, headers)
        if k and spec is None and before:
            # SGLang's verify series appears with the first verify step it counts; until then the
            # formulas hold with 0 verify calls (requests it finished without one still count).
            spec = metrics.SpecCounters(accepted=traffic.generation_tokens - traffic.requests)
        return spec, traffic

    def cross_check(self, url, headers):
        try:
            return {"server_avg_accept_length_since_start": accept_length(url, headers)}
        except metrics.MetricsError as e:
            return {"server_avg_accept_length_since_start": None, "cross_check_error": str(e)}

    version_paths = ("/server_info", "/get_server_info", "/version")

    load_client = "python -m sglang.bench_serving"
    load_client_module = "sglang.bench_serving"
    dataset_suffix = ".json"

    def write_dataset(self, path, texts):
        return write_prompts(path, texts)

    def open_load_client(self, sup, env_cfg, env, name, log_dir, phase, hang_timeout_s):
        return loadgen.OneShotClient(sup, self, env_cfg, env, name, log_dir, phase, hang_timeout_s)

    def load_argv(self, env_cfg, spec):
        return load_argv(env_cfg, spec)

    def parse_load(self, result_file):
        return parse_result(result_file)

    drafter_layout = "sglang"
    # SGLang's LlamaForCausalLMEagle3 has no input_norm and no final norm before the head.
    drafter_train_flags = ("--no-norm-before-fc", "--no-norm-before-residual", "--no-norm-output")

    managed_flags = {
        ("--model-path", "--model"): "target.model",
        ("--tp-size", "--tensor-parallel-size"): "target.tensor_parallel_size",
        ("--dp-size", "--data-parallel-size"): "target.data_parallel_size",
        ("--context-length",): "target.max_model_len",
        ("--speculative-algorithm", "--speculative-draft-model-path", "--speculative-draft-model",
         "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"): SPECULATIVE,
    }


# ---- its counters on /metrics (with --enable-metrics, which serve_argv always passes) --------------
# Per finished request, label `model_name`: requests, completion tokens and verify steps. A request's
# completion is its prefill's token plus, per verify step, the accepted drafts and one bonus token, so
# over a window
#   drafts   = verify calls
#   accepted = generation tokens - requests - verify calls
# and eagle3/engines/metrics.py's formulas give vLLM's definitions (SGLang's own "accept length",
# completion tokens / verify calls, also counts the prefill's token: higher by about 1/verify calls per
# request). It counts no acceptance per position. Its /server_info `avg_spec_accept_length` is an
# average since the server started (warm-up included), kept only as a cross-check.
REQUESTS = "sglang:num_requests_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
GENERATION_TOKENS = "sglang:generation_tokens_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"
TRAFFIC = (REQUESTS, PROMPT_TOKENS, GENERATION_TOKENS)


def spec_counters(samples: list[metrics.Sample], k: int, model_name: str | None = None) -> metrics.SpecCounters | None:
    """Its counters as SpecCounters (the comment above); None before its first verify step is counted
    (a server without a drafter never counts one)."""
    if not any(s.name == VERIFY_CALLS and model_name in (None, s.labels.get("model_name", model_name))
               for s in samples):
        return None
    t = metrics.sums(samples, (REQUESTS, GENERATION_TOKENS, VERIFY_CALLS), model_name)
    verify = int(t[VERIFY_CALLS])
    return metrics.SpecCounters(drafts=verify, draft_tokens=verify * k,
                                accepted=int(t[GENERATION_TOKENS]) - int(t[REQUESTS]) - verify)


def read_counters(base_url: str, k: int, model_name: str | None = None, headers: dict[str, str] | None = None,
                  timeout_s: float = 10.0) -> tuple[metrics.SpecCounters | None, metrics.Traffic]:
    """SGLang's spec-decode counters (None until it counted a verify step) and traffic counters."""
    samples = metrics.fetch_samples(base_url, headers, timeout_s)
    return spec_counters(samples, k, model_name), metrics.Traffic.from_samples(samples, model_name, TRAFFIC)


def accept_length(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> float | None:
    """SGLang's average accept length since the server started (None when not speculating)."""
    for path in ("/server_info", "/get_server_info"):  # the second is the deprecated name
        try:
            data = metrics.get(f"{base_url}{path}", headers, timeout_s).json()
        except (metrics.MetricsError, ValueError):
            continue
        states = data.get("internal_states") or [{}]
        value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        return None
    raise metrics.MetricsError(f"{base_url}: neither /server_info nor /get_server_info answered")


# ---- its load generator, `python -m sglang.bench_serving` ------------------------------------

def write_prompts(path: Path, prompts: list[str]) -> Path:
    """ShareGPT layout; the second turn is a placeholder, --sharegpt-output-len sets the length."""
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "-"}]}
            for i, p in enumerate(prompts)]
    atomic_write_text(path, json.dumps(rows, ensure_ascii=False))
    return path



def load_argv(env, s: LoadSpec) -> list[str]:
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


def parse_result(path: Path) -> LoadResult:
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


ENGINE = Sglang()
