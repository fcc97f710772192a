"""SGLang: launch command and readiness. (SGLang cannot run on a CPU-only machine; these follow
its documented flags and are exercised on GPU nodes.)"""

from __future__ import annotations

from pathlib import Path

from ..config import EngineEnv, Server, Target
from ..process.services import HttpProbe, LogProbe, Probe

READY_LINE = r"The server is fired up and ready to roll!"
LAUNCHER = Path(__file__).resolve().parent.parent / "engine_side" / "sglang_serve.py"
KEY_ENV = "EAGLE3_SERVER_API_KEY"
# SGLang ends its own process tree on SIGTERM to its leader (drain, then kill_process_tree). SIGTERM
# to the whole group reaches its detokenizer first, which its leader takes for a crash: SIGQUIT, five
# seconds of crash diagnostics, a log that reads as a failure (seen on the H200, 0.5.16).
STOP_LEADER_FIRST = True


def serve_argv(env: EngineEnv, target: Target, server: Server, extra: list[str] = ()) -> list[str]:
    argv = [*env.python_argv(), str(LAUNCHER),
            "--model-path", str(target.model),
            "--served-model-name", target.served_name,
            "--host", server.host, "--port", str(server.port),
            "--context-length", str(target.max_model_len),
            "--dtype", target.dtype,
            "--tp-size", str(target.tensor_parallel_size),
            "--enable-metrics"]  # the counters the benchmark's windows are measured by (engines/metrics.py)
    if target.trust_remote_code:
        argv.append("--trust-remote-code")
    return argv + list(extra) + list(server.extra_args)


def serve_env(key: str) -> dict[str, str]:
    # SGLang reads its key only from --api-key; the launcher appends it after exec (see there).
    return {KEY_ENV: key}


def readiness(server: Server, log: Path) -> list[Probe]:
    # SGLang answers HTTP (even /v1/models) before warm-up; /health turns 200 after it, and the
    # ready line is printed once the warm-up request has gone through. Require both.
    return [HttpProbe(f"http://{server.host}:{server.port}/health"), LogProbe(log, READY_LINE)]
