"""Start an engine's OpenAI-compatible server under supervision, whichever engine it is."""

from __future__ import annotations

from .. import procfs
from ..config import PipelineConfig, Server
from ..errors import PipelineError
from ..services import LaunchSpec, Process, Supervisor
from . import sglang, vllm

ADAPTERS = {"vllm": vllm, "sglang": sglang}


class PortBusy(PipelineError):
    """Something already listens on the server's port: launching would fail after a long load."""


def start_server(sup: Supervisor, cfg: PipelineConfig, phase: str, engine: str, server: Server,
                 extra_args: list[str] = (), env: dict[str, str] | None = None) -> Process:
    """Launch, then block until ready (or raise a retryable ServiceError with the log tail)."""
    busy = procfs.listening_ports({server.port})
    if busy:
        raise PortBusy(f"{phase}: port {server.port} ({server.host}) is already in use ({busy[server.port]}) before "
                       f"the {engine} server started; stop whatever listens there or change {phase}.server.port")
    adapter = ADAPTERS[engine]
    engine_env = getattr(cfg.engines, engine)
    log = cfg.phase_dir(phase) / "logs" / f"{engine}-server.log"
    spec = LaunchSpec(
        name=f"{phase}-{engine}-server",
        argv=adapter.serve_argv(engine_env, cfg.target, server, extra_args),
        log=log,
        phase=phase,
        env={**engine_env.env, **adapter.serve_env(server), **(env or {})},
        gpus=list(cfg.gpus),
        stop_grace_s=server.stop_grace_s,
        hang_timeout_s=server.hang_timeout_s,
        secrets=[server.api_key.get_secret_value()] if server.api_key else [],
    )
    proc = sup.launch(spec)
    proc.wait_ready(adapter.readiness(server, log), timeout_s=server.startup_timeout_s)
    return proc


def base_url(server: Server) -> str:
    return f"http://{server.host}:{server.port}"
