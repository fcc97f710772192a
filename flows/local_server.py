"""The Prefect API server of an `eagle3 run` that has no PREFECT_API_URL.

Prefect's own ephemeral server is a bare child process: after `kill -9` of the run it lived on,
orphaned, and nothing ever ended it. This one is the same server (the command Prefect's
SubprocessASGIServer runs), launched through the pack's supervisor as a *run-scoped* service:
recorded in the run dir's registry with the run's PID, left alone by the handoffs between phases,
stopped when the run ends, and found and ended by the next run's recovery handoff if the run died.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
from pathlib import Path
from typing import Iterator

from eagle3 import progress
from eagle3.process.services import HttpProbe, LaunchSpec, Process, Supervisor

STARTUP_TIMEOUT_S = 240.0  # a cold start (database migrations) takes ~25 s on 2 cores
STOP_GRACE_S = 10.0
AUTH_SERVER_ENV, AUTH_CLIENT_ENV = "PREFECT_SERVER_API_AUTH_STRING", "PREFECT_API_AUTH_STRING"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def auth_string(sup: Supervisor) -> str:
    """The run's Prefect auth string ("user:password" of HTTP basic auth), derived from the owner token."""
    return f"eagle3:{sup.registry.secret('prefect server auth')}"


def start_local_server(sup: Supervisor, log_dir: Path) -> tuple[Process, str]:
    """Start the server, wait until it answers, and return it with its API URL."""
    port = _free_port()
    site = Path(importlib.util.find_spec("prefect").origin).parent.parent
    argv = [sys.executable, "-m", "uvicorn", "--app-dir", str(site),
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "error", "--lifespan", "on"]
    # Bound to 127.0.0.1, it is reachable by every local user: it demands the run's own auth string
    # (HTTP basic), which the pack's clients send (PREFECT_API_AUTH_STRING) and nobody else knows.
    env = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1",
           AUTH_SERVER_ENV: auth_string(sup)}
    proc = sup.launch(LaunchSpec(name="prefect-server", argv=argv, log=Path(log_dir) / "prefect-server.log",
                                 phase="run", env=env, stop_grace_s=STOP_GRACE_S, scope="run"))
    url = f"http://127.0.0.1:{port}/api"
    what = f"waiting for the run's Prefect server (PID {proc.pid}, port {port})"
    waited = proc.wait_ready([HttpProbe(f"{url}/health")], STARTUP_TIMEOUT_S,
                             on_wait=lambda s: progress.waiting("run", what, s))
    # The note ends the wait line: without it, what comes next (the engine probes) went on showing as
    # "waiting for the run's Prefect server", and was taken for it on the H200 (37-41 s).
    progress.note("run", f"the run's Prefect server answered after {waited:.1f} s (PID {proc.pid}, port {port})")
    return proc, url


@contextlib.contextmanager
def api_server(sup: Supervisor, log_dir: Path) -> Iterator[str]:
    """The Prefect API this run talks to: the configured one (environment or profile), else a
    server of the run's own for the duration of the block (and for the processes it starts)."""
    from prefect.context import refresh_global_settings_context
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        yield PREFECT_API_URL.value()
        return
    proc, url = start_local_server(sup, log_dir)
    # The global settings, not a context-local override: Prefect's background threads (log and
    # event shippers) read them, and without an API URL they would start a server of their own.
    os.environ["PREFECT_API_URL"] = url
    os.environ[AUTH_CLIENT_ENV] = auth_string(sup)  # the workers and subprocesses it starts inherit it
    refresh_global_settings_context()
    try:
        yield url
    finally:
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()  # the run's last log records, while the server still answers
        os.environ.pop("PREFECT_API_URL", None)
        os.environ.pop(AUTH_CLIENT_ENV, None)
        refresh_global_settings_context()
        proc.stop()
