"""vLLM: the OpenAI-compatible server's command line, readiness and metrics."""

from __future__ import annotations

from pathlib import Path

from ..config import EngineEnv, Server, Target
from ..process.services import HttpProbe, Probe

STOP_LEADER_FIRST = False  # SIGTERM to the whole group: vLLM's API server and EngineCore each shut down on it


def serve_argv(env: EngineEnv, target: Target, server: Server, extra: list[str] = ()) -> list[str]:
    argv = [*env.script_argv("vllm"), "serve", str(target.model),
            "--served-model-name", target.served_name,
            "--host", server.host, "--port", str(server.port),
            "--max-model-len", str(target.max_model_len),
            "--dtype", target.dtype,
            "--tensor-parallel-size", str(target.tensor_parallel_size)]
    if target.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + list(extra) + list(server.extra_args)


def serve_env(key: str) -> dict[str, str]:
    # The key goes through the environment, never argv: argv is visible in `ps` to every user.
    return {"VLLM_API_KEY": key}


def readiness(server: Server, log: Path) -> list[Probe]:
    # vLLM opens its HTTP port only after the engine is built, so the first 200 means ready.
    return [HttpProbe(f"http://{server.host}:{server.port}/health")]
