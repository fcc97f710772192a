"""The online train step: the extraction server and the trainer side by side in one phase.

Where a phase is defined (for the phase table): in online mode the `train` phase hosts two
supervised services of this phase: the vLLM extraction server (extract.server, on
hidden_states.server_gpus, serving the target under its path, which speculators' data loader
checks against the model id it finds) and `speculators train --on-missing generate
--vllm-endpoint` (on hidden_states.train_gpus). The server writes each requested sample to the
on-demand cache (RunLayout.hs_cache); the trainer loads it and deletes it.

Bounded: a guard thread sums the cache every second, records the peak, removes orphans (complete
files nobody loaded: a request that timed out client-side, a killed data-loader worker) once they
are older than ORPHAN_AGE_S, and stops both services if the cache still exceeds its bound.
Nothing of a killed run is trusted: the cache is emptied before the server starts, after the step
and by every handoff; the trainer resumes from its own checkpoints (train_resume.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from .. import progress
from . import hs_mode
from ..handoff import scratch
from .. import engine_registry
from ..config import PipelineConfig
from ..engines import hidden_states as hs_server
from ..engines.serving import base_url, client_env, start_server
from ..errors import GateError, PipelineError, TrainingStopped
from ..fsio import atomic_write_json
from ..process.services import LaunchSpec, Process, Supervisor
from ..ticker import Ticker
from .extract_manifest import ExtractManifest

PHASE = "train"
ORPHAN_AGE_S = 600.0  # > speculators' request timeout × attempts: a file this old has no reader left
log = logging.getLogger("eagle3.train")


class CacheBoundExceeded(GateError):
    """The on-demand cache grew past its bound: the trainer is not consuming what it asks for."""


@dataclass
class CacheStats:
    """The cache as the guard saw it, every `sample_interval_s`: a file the trainer loads within
    milliseconds of its write may fall between two looks, so the peak is a sampled lower bound of
    the true one; a cache that grows (what the bound is for) stays and is seen."""
    bound: int
    sample_interval_s: float
    sampled_peak_bytes: int = 0
    sampled_peak_files: int = 0
    orphans_removed: int = 0
    exceeded: str | None = None


class CacheGuard(Ticker):
    def __init__(self, cache: Path, bound: int, on_exceeded, interval_s: float = 0.1,
                 orphan_age_s: float = ORPHAN_AGE_S):
        super().__init__(interval_s, name="online-cache-guard")
        self.cache, self.stats, self.on_exceeded = cache, CacheStats(bound, interval_s), on_exceeded
        self.orphan_age_s = orphan_age_s

    def scan(self) -> None:
        total = files = 0
        now = time.time()
        try:
            names = os.listdir(self.cache)
        except OSError:
            return
        for name in names:
            path = self.cache / name
            try:
                st = path.stat()
            except OSError:
                continue  # loaded and deleted meanwhile
            if name.endswith(".safetensors") and now - st.st_mtime > self.orphan_age_s and self._unlocked(path):
                with contextlib.suppress(OSError):
                    path.unlink()
                    Path(str(path) + ".lock").unlink(missing_ok=True)
                    self.stats.orphans_removed += 1
                    continue
            total += st.st_size
            files += name.endswith(".safetensors")
        self.stats.sampled_peak_bytes = max(self.stats.sampled_peak_bytes, total)
        self.stats.sampled_peak_files = max(self.stats.sampled_peak_files, files)
        if total > self.stats.bound and self.stats.exceeded is None:
            self.stats.exceeded = (f"the on-demand hidden-state cache {self.cache} holds {total} bytes in {files} "
                                   f"file(s), above its bound of {self.stats.bound} bytes")
            self.on_exceeded()

    @staticmethod
    def _unlocked(path: Path) -> bool:
        import fcntl

        try:
            fd = os.open(str(path) + ".lock", os.O_RDONLY)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the server holds LOCK_EX while writing
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    tick = scan


def endpoint(cfg: PipelineConfig) -> str:
    return base_url(cfg.extract.server) + "/v1"


def served_name(cfg: PipelineConfig) -> str:
    """speculators' data loader passes --verifier-name-or-path as the model id and refuses a server
    whose /v1/models names another, so the online server serves the target under its path."""
    return str(cfg.target.model)


@contextlib.contextmanager
def extraction_server(cfg: PipelineConfig, sup: Supervisor, ext: ExtractManifest) -> Iterator[tuple[Process, CacheGuard]]:
    """The co-scheduled extraction server and the guard of its cache, for the body of the step."""
    cache = cfg.layout.hs_cache
    scratch.purge(cache)  # files of a killed run: no reader is left for them
    cache.mkdir(parents=True)
    largest = None
    index = hs_mode.read_prepared_index(cfg)
    if index and index["seq_len"]:
        largest = max(index["seq_len"]) * hs_mode.per_token_bytes(cfg) + 256
    bound = hs_mode.cache_bound(cfg, largest)
    progress.step(PHASE, f"starting the extraction server for on-demand hidden states (cache bound {bound} bytes)")
    engine = engine_registry.get(cfg.extract.engine)
    flags, env = engine.extraction_server(cfg, sup, list(ext.layer_ids), ext.dtype, cache)
    server = start_server(sup, cfg, PHASE, engine.name, cfg.extract.server, extra_args=flags, env=env,
                          gpus=list(cfg.hidden_states.server_gpus), served_name=served_name(cfg))
    guard = CacheGuard(cache, bound, on_exceeded=sup.stop_all)
    try:
        with guard:
            try:
                yield server, guard
            except PipelineError as e:
                if guard.stats.exceeded:
                    raise _exceeded(guard) from e
                if not _stopped(e):
                    server.check_alive()  # a trainer that failed because the server died: say that
                raise
    finally:
        server.stop()
        scratch.purge(cache)
    if guard.stats.exceeded:
        raise _exceeded(guard)


def _stopped(e: PipelineError) -> bool:
    """The trainer saved its interrupt checkpoint: one stop ended it and the server alike (seen on
    an H200), and the resumable stop, not the server's exit, is what the caller must see."""
    return isinstance(e, TrainingStopped)


def _exceeded(guard: CacheGuard) -> CacheBoundExceeded:
    return CacheBoundExceeded(guard.stats.exceeded + "; both services were stopped. See the trainer's log (a "
                              "data-loader worker that stopped consuming) or raise hidden_states.cache_max_bytes")


def fetch_check(cfg: PipelineConfig, sup: Supervisor, ext: ExtractManifest, out: Path, log_path: Path) -> dict:
    """CPU rehearsal: every prepared sample through speculators' own on-demand data path."""
    import json

    script = hs_server.ENGINE_SIDE_DIR / "online_fetch.py"
    argv = [*cfg.engines.speculators.python_argv(), str(script), "--data", ext.prepared_data,
            "--cache", str(cfg.layout.hs_cache), "--endpoint", endpoint(cfg),
            "--model", served_name(cfg), "--out", str(out), "--max-len", str(cfg.train.total_seq_len)]
    progress.step(PHASE, f"speculators' on-demand data path: fetching {ext.num_samples} samples from the server")
    spec = LaunchSpec(name="train-online-fetch", argv=argv, log=log_path, phase=PHASE,
                      env={**cfg.engines.speculators.env, "CUDA_VISIBLE_DEVICES": ""}
                      | client_env(cfg, cfg.extract.server, "extract.server", cfg.engines.speculators.env),
                      stop_grace_s=cfg.train.stop_grace_s, hang_timeout_s=cfg.train.hang_timeout_s)
    sup.run(spec)
    return json.loads(out.read_text())


def record(path: Path, stats: CacheStats, extra: dict) -> dict:
    data = {**asdict(stats), **extra}
    atomic_write_json(path, data)
    return data
