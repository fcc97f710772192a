"""A phase added to the pipeline by a test, the way a new capability adds one: this module (its
settings model and its function) plus one row of the phase table. Nothing else in the pack names it.
It runs after the no-op bench phase (noop_phases.py): it serves the bench phase's dir on its own
server (a stand-in engine: Python's http.server, supervised like any engine server, on the port of
its config section), fetches bench's output through it and writes a digest of it. A scratch file it
leaves is its row's `purge`: the handoff after it must remove it."""

from __future__ import annotations

import hashlib
import sys
import urllib.request
from pathlib import Path
from typing import Literal

from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parent))
import noop_phases  # noqa: E402

from eagle3.config import PhaseSettings, Server  # noqa: E402
from eagle3.engines.serving import OwnListener  # noqa: E402
from eagle3.phase_table import Phase  # noqa: E402
from eagle3.phases import PhaseSummary  # noqa: E402
from eagle3.process.services import HttpProbe, LaunchSpec  # noqa: E402
from eagle3.progress import PhaseProgress  # noqa: E402

NAME = "digest"


class Settings(PhaseSettings):
    """The `digest:` config section."""

    engine: Literal["vllm"] = Field("vllm", description="The engine of its server (checked like any phase's).")
    server: Server = Field(description="The server that serves bench's output to this phase.")
    algorithm: Literal["sha256", "blake2b"] = Field("sha256", description="The digest's hash.")


def digest(cfg, sup) -> PhaseSummary:
    s: Settings = cfg.digest
    source = cfg.phase_dir("bench")
    out = cfg.phase_dir(NAME)
    (out / "scratch").mkdir(parents=True, exist_ok=True)
    (out / "scratch" / "spill.bin").write_bytes(b"\0" * 4096)  # left for the handoff to purge
    proc = sup.launch(LaunchSpec(name=f"{NAME}-server", phase=NAME, log=out / "server.log", argv=[
        sys.executable, "-m", "http.server", str(s.server.port), "--bind", s.server.host, "--directory", str(source)]))
    url = f"http://{s.server.host}:{s.server.port}"
    proc.wait_ready([OwnListener(s.server.port, proc.entry.pgid), HttpProbe(f"{url}/output.txt")],
                    timeout_s=s.server.startup_timeout_s)
    with urllib.request.urlopen(f"{url}/output.txt", timeout=10) as r:
        data = r.read()
    value = hashlib.new(s.algorithm, data).hexdigest()
    (out / "digest.txt").write_text(value + "\n")
    PhaseProgress(NAME, unit="files")(1, 1)
    return PhaseSummary(str(out / "digest.txt"), f"{s.algorithm} {value[:12]} of {source / 'output.txt'}",
                        {"digest": value, "algorithm": s.algorithm, "of": str(source / "output.txt"),
                         "server_pid": proc.pid})


ROW = Phase(NAME, "bench", f"{__name__}:digest", "digest.txt: a digest of the bench phase's output.txt",
            settings=f"{__name__}:Settings", outputs=("digest.txt",), server=True, purge=("scratch",),
            help="Digest bench's output through the phase's own server.")
TABLE = (*noop_phases.TABLE, ROW)
