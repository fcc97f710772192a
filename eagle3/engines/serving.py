"""Start an engine's OpenAI-compatible server under supervision, whichever engine it is."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from ..appendlog import AppendLog
from ..process import procfs
from .. import progress
from ..config import PipelineConfig, Server
from ..errors import PipelineError
from ..process.services import LAUNCH_MARKER, LaunchSpec, Process, Registry, Supervisor
from .. import engine_registry
from . import compile_cache, probe


class PortBusy(PipelineError):
    """Something already listens on the server's port: launching would fail after a long load."""


def start_server(sup: Supervisor, cfg: PipelineConfig, phase: str, engine: str, server: Server,
                 extra_args: list[str] = (), env: dict[str, str] | None = None, gpus: list[int] | None = None,
                 served_name: str | None = None, instance: str = "",
                 on_launch: Callable[[Process], None] | None = None) -> Process:
    """Launch, then block until ready (or raise a retryable ServiceError with the log tail).
    `gpus` (default: all of cfg.gpus) and `served_name` (default: target.served_name) serve the
    online train phase, whose server shares the node with the trainer; `instance` names one of several
    servers a phase runs at once (its process name and log get it as a suffix); `on_launch` gets the
    process as soon as it is launched (another thread may then stop it while this one waits)."""
    busy = procfs.listening_ports({server.port})
    if busy:
        raise PortBusy(f"{phase}: port {server.port} ({server.host}) is already in use ({busy[server.port]}) before "
                       f"the {engine} server started; stop whatever listens there or change {phase}.server.port")
    key = api_key(cfg, server, f"{phase}.server")  # an unset api_key_env fails here, naming the field
    adapter = engine_registry.get(engine)
    engine_env = getattr(cfg.engines, engine)
    suffix = f"-{instance}" if instance else ""
    log = cfg.phase_dir(phase) / "logs" / f"{engine}-server{suffix}.log"
    name = f"{phase}-{engine}-server{suffix}"
    argv = adapter.serve_argv(engine_env, cfg.target.model_copy(update={"served_name": served_name})
                              if served_name else cfg.target, server, extra_args)
    gpus = list(cfg.gpus if gpus is None else gpus)
    server_env = server_environment(cfg, engine, env)
    cache = _compile_dir(cfg, sup, engine, name, argv, server_env, gpus) if engine_env.compile_cache else None
    if cache is not None:
        server_env.update(adapter.compile_cache_env(cache.path))
        if cache.shared is not None:
            adapter.share_across_keys(cache.path, cache.shared)
    spec = LaunchSpec(
        name=name,
        argv=argv,
        log=log,
        phase=phase,
        env={**server_env, **adapter.serve_env(key)},
        gpus=gpus,
        stop_grace_s=server.stop_grace_s,
        hang_timeout_s=server.hang_timeout_s,
        secrets=[key],
        stop_leader_first=adapter.stop_leader_first,
    )
    launched_at, ready = time.time(), False
    try:
        proc = sup.launch(spec)
        if on_launch is not None:
            on_launch(proc)
        what = (f"waiting for {engine} server readiness (PID {proc.pid}, port {server.port}, "
                f"budget {server.startup_timeout_s:.0f} s)")
        # The listener check comes last so it runs only once the engine's own probes pass.
        waited = proc.wait_ready([*adapter.readiness(server, log), OwnListener(server.port, proc.entry.pgid)],
                                 timeout_s=server.startup_timeout_s,
                                 on_wait=lambda s: progress.waiting(phase, what, s))
        ready = True
    finally:
        if cache is not None:
            cache.close(ready)
    steps = adapter.start_breakdown(this_launch(log), launched_at)
    said = ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in steps.items())
    progress.note(phase, f"{engine} server ready after {waited:.1f} s (PID {proc.pid}, port {server.port})"
                  + (f"; by its log: {said}" if said else ""))
    # One row per server start: what a GPU run's record and `eagle3 status` time.
    with AppendLog(cfg.layout.server_starts, fsync_every=1) as starts:
        starts.append({"phase": phase, "name": spec.name, "engine": engine, "seconds": round(waited, 2),
                       "steps": steps, "pid": proc.pid, "port": server.port, "log": str(log), "at": time.time(),
                       "compile_cache": None if cache is None else cache.record()})
    return proc


def server_environment(cfg: PipelineConfig, engine: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """What a server of `engine` gets on top of the pack's own environment: the engine's defaults, then
    engines.<engine>.env, then what the phase adds (`env`); a later one wins."""
    return {**engine_registry.get(engine).server_env_defaults, **getattr(cfg.engines, engine).env, **(env or {})}


def _compile_dir(cfg: PipelineConfig, sup: Supervisor, engine: str, name: str, argv: list[str],
                 env: dict[str, str], gpus: list[int]) -> compile_cache.CacheDir:
    """Where this start compiles (with no probed version, a scratch dir: nothing is reused)."""
    # Only a probe the preflight already ran: a start never waits on one (a phase run alone gets no key).
    versions = (probe.inspect_engine(cfg, sup, engine, cached_only=True) or {}).get("versions")
    material = compile_cache.key_material(engine, versions, argv, env, cfg.target.model,
                                          compile_cache.gpu_names(gpus)) if versions else None
    root = compile_cache.user_root() or cfg.layout.compile_cache
    return compile_cache.prepare(root, engine, material, cfg.layout.compile_scratch(name))


def this_launch(log: Path, limit: int = 4 * 1024 * 1024) -> str:
    """The log's text since its last launch line (a log is appended to by every start of its server)."""
    with open(log, "rb") as f:
        f.seek(max(0, log.stat().st_size - limit))
        text = f.read().decode(errors="replace")
    return text[text.rfind(LAUNCH_MARKER):] if LAUNCH_MARKER in text else text


class OwnListener:
    """Ready only when the process listening on the port belongs to our server's process group.

    Engines bind their port late (vLLM after building the engine), so another server can take a
    port that was free at launch; without this, its /health would pass for ours and the phase
    would talk to a stranger while our server dies failing to bind."""

    def __init__(self, port: int, pgid: int):
        self.port, self.pgid = port, pgid

    def ready(self) -> bool:
        inodes = procfs.listening_sockets({self.port}).get(self.port, set())
        holders = set().union(*procfs.socket_pids(inodes).values()) if inodes else set()
        return any((info := procfs.read_stat(pid)) is not None and info.pgid == self.pgid for pid in holders)

    def describe(self) -> str:
        return f"port {self.port} held by process group {self.pgid}"


def base_url(server: Server) -> str:
    return f"http://{server.host}:{server.port}"


KEY_PURPOSE = "server api key"
CLIENT_AUTH_DIR = Path(__file__).resolve().parent.parent / "engine_side" / "client_auth"
CLIENT_KEY_ENV, CLIENT_ORIGIN_ENV = "EAGLE3_SERVER_API_KEY", "EAGLE3_SERVER_ORIGIN"


def api_key(cfg: PipelineConfig, server: Server, where: str) -> str:
    """The key every server the pack starts demands: the configured one, else the run's own
    (derived from the run's owner token, so only the user can know it, and the same on every
    resume). Another local user's request without it gets 401."""
    return server.key(where) or Registry(cfg.layout.state).secret(KEY_PURPOSE)


def client_env(cfg: PipelineConfig, server: Server, where: str, base: dict[str, str]) -> dict[str, str]:
    """Environment for a speculators client of the pack's own server (prepare-data, generate-
    offline-data, the online trainer): they send the fixed key "EMPTY", so the engine-side
    sitecustomize in CLIENT_AUTH_DIR puts the run's key on their requests to that server alone."""
    path = [str(CLIENT_AUTH_DIR), *filter(None, [base.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))])]
    return {"PYTHONPATH": os.pathsep.join(path), CLIENT_KEY_ENV: api_key(cfg, server, where),
            CLIENT_ORIGIN_ENV: base_url(server)}
