"""SGLang: every fact the pack uses about it (eagle3/engines/engine.py lists them). SGLang cannot run
on a CPU-only machine; these follow its documented flags and are exercised on GPU nodes."""

from __future__ import annotations

from pathlib import Path

from ..process.readiness import HttpProbe, LogProbe, Probe
from . import benchclient, loadgen, metrics
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
        spec, traffic = metrics.scrape_sglang_all(url, k, served_name, headers)
        if k and spec is None and before:
            # SGLang's verify series appears with the first verify step it counts; until then the
            # formulas hold with 0 verify calls (requests it finished without one still count).
            spec = metrics.SpecCounters(accepted=traffic.generation_tokens - traffic.requests)
        return spec, traffic

    def cross_check(self, url, headers):
        try:
            return {"server_avg_accept_length_since_start": metrics.sglang_accept_length(url, headers)}
        except metrics.MetricsError as e:
            return {"server_avg_accept_length_since_start": None, "cross_check_error": str(e)}

    version_paths = ("/server_info", "/get_server_info", "/version")

    load_client = "python -m sglang.bench_serving"
    load_client_module = "sglang.bench_serving"
    dataset_suffix = ".json"

    def write_dataset(self, path, texts):
        return benchclient.write_sglang_dataset(path, texts)

    def open_load_client(self, sup, env_cfg, env, name, log_dir, phase, hang_timeout_s):
        return loadgen.OneShotClient(sup, self, env_cfg, env, name, log_dir, phase, hang_timeout_s)

    def load_argv(self, env_cfg, spec):
        return benchclient.sglang_argv(env_cfg, spec)

    def parse_load(self, result_file):
        return benchclient.parse_sglang(result_file)

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


ENGINE = Sglang()
