"""Phase bookkeeping shared by the CLI and the Prefect flow: which phases to run, when a phase
counts as done, and how a phase is run under supervision.

A phase is done when its DONE marker exists, matches the phase's config fingerprint and the
upstream output it was built from, and the outputs its table row names are still there. The
marker is written atomically after the phase's own validation passed, so a crash leaves either
no marker or a complete one; it is removed before a phase removes any output (a forced redo, a
stale upstream), so an interrupted redo leaves the phase "not done", never "done" over a
half-deleted output. Each marker carries
its own fingerprint; a later phase records the fingerprint of the upstream it consumed, so a
redone upstream invalidates everything downstream of it and nothing else.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import shutil
import time
from pathlib import Path

from . import __version__, phase_table, progress
from .config import PipelineConfig
from .errors import ConfigError
from .fsio import atomic_write_json, fsync_dir, read_json
from .marker import DoneMarker
from .phases import PhaseSummary, phase_lock
from .process.services import Supervisor

log = logging.getLogger("eagle3.phase_runner")


def supervisor(cfg: PipelineConfig) -> Supervisor:
    """The run dir's supervisor. Where GPUs are configured its hang watchdog gets NVML's memory
    sample, injected here: the process layer builds on nothing above it."""
    sample = None
    if cfg.gpus:
        from .handoff.gpus import gpu_memory_sample  # NVML only where GPUs are configured

        sample = gpu_memory_sample
    return Supervisor(cfg.layout.state, gpu_sample=sample)


def _marker_path(cfg: PipelineConfig, phase: str) -> Path:
    return cfg.layout.done_marker(phase)


def _started_path(cfg: PipelineConfig, phase: str) -> Path:
    return cfg.layout.started_marker(phase)


def code_version(phase: str) -> str:
    """Package version plus a hash of the phase module's source, recorded in the DONE marker for
    the reader; not part of what makes a phase done (a code change does not redo finished
    phases; `--force` does)."""
    try:
        source = Path(importlib.import_module(phase_table.get(phase).module).__file__).read_bytes()
    except (ImportError, TypeError, OSError):
        source = b""
    return f"{__version__}+{hashlib.sha256(source).hexdigest()[:12]}"


def done_marker(cfg: PipelineConfig, phase: str) -> DoneMarker | None:
    return DoneMarker.from_dict(read_json(_marker_path(cfg, phase)))


def done_key(cfg: PipelineConfig, phase: str, upstream: str | None) -> str:
    """What a DONE marker is valid for: the phase's config and the upstream output it consumed.
    The Prefect cache key of a phase is this key (tasks/phases.py): the marker is the authority."""
    return _key(cfg.fingerprint(phase), upstream)


def _key(config: str | None, upstream: str | None) -> str:
    return f"{config}-{upstream}"


def upstream_of(cfg: PipelineConfig, phase: str) -> str | None:
    """The phase whose output this config makes `phase` consume: its row's upstream, unless its
    section says it does not need it (a bench with a drafter of its own)."""
    up = phase_table.get(phase).upstream
    section = cfg.section(phase)
    return up if up and (section is None or section.needs_upstream()) else None


FROM_RUN_DIR = object()  # the upstream fingerprint comes from the run dir's own upstream marker


def upstream_fingerprint(cfg: PipelineConfig, phase: str, produced: dict[str, str] | None = None) -> str | None:
    """The one upstream rule (the flow, the fan-out and run_phase all use it): the fingerprint of the
    output `phase` consumes under this config: the one this run just produced, else the run dir's
    finished one; None when it consumes none, or when its upstream is not finished (run_phase then
    refuses, saying what to run first)."""
    up = upstream_of(cfg, phase)
    if up is None:
        return None
    return (produced or {}).get(up) or output_fingerprint(cfg, up)


def is_done(cfg: PipelineConfig, phase: str, upstream=FROM_RUN_DIR) -> bool:
    """Done for this config; `upstream` (a fingerprint) replaces the run dir's own upstream marker
    for a run dir that has none: a shard's, whose upstream is the run's."""
    marker = done_marker(cfg, phase)
    if not marker:
        return False
    if upstream is FROM_RUN_DIR:
        up = upstream_of(cfg, phase)
        upstream = output_fingerprint(cfg, up) if up else None
    return (_key(marker.config, marker.upstream) == done_key(cfg, phase, upstream)
            and not phase_table.get(phase).missing_outputs(cfg.phase_dir(phase)))


def output_fingerprint(cfg: PipelineConfig, phase: str) -> str | None:
    marker = done_marker(cfg, phase)
    return marker.fingerprint if marker else None


def require_upstream(cfg: PipelineConfig, phase: str) -> str | None:
    """Fingerprint of the finished upstream phase, or a clear error saying what to run first."""
    up = upstream_of(cfg, phase)
    if up is None:
        return None
    if not is_done(cfg, up):
        raise ConfigError(f"phase '{phase}' needs '{up}' finished for this config (no valid {up} output in "
                          f"{cfg.run_dir}); run `eagle3 run --from {up}` or the full pipeline")
    return output_fingerprint(cfg, up)


def clear_phase(cfg: PipelineConfig, phase: str) -> None:
    """Forget the phase, markers first (durably), then its output: an interruption anywhere leaves
    it "not done"."""
    _marker_path(cfg, phase).unlink(missing_ok=True)
    _started_path(cfg, phase).unlink(missing_ok=True)
    if cfg.layout.state.is_dir():
        fsync_dir(cfg.layout.state)
    shutil.rmtree(cfg.phase_dir(phase), ignore_errors=True)


def run_phase(cfg: PipelineConfig, phase: str, sup: Supervisor | None = None, force: bool = False,
              on_progress: progress.ProgressFn | None = None, force_token: str | None = None,
              options: dict | None = None, upstream=FROM_RUN_DIR, body=None) -> DoneMarker:
    """Run one phase to completion (resuming what a previous attempt left) and mark it done, under
    the phase's lock (a second process on the same phase gets RunDirBusy at once). Every way of
    running a phase comes here: the flow's task, `eagle3 run`, `eagle3 <phase>`.

    `force` wipes the phase's output first, once per `force_token`: a retried run that already
    redid the phase under the same token keeps that fresh output instead of wiping it again.
    `options`: the row's command options that were given, passed to the phase as keywords.
    `upstream`: the fingerprint of the upstream output, where it is not this run dir's (a shard).
    `on_progress(done, total)`: the phase's progress, for a caller that wants it (every progress goes to
    the event bus, eagle3.progress, whoever listens).
    `body(cfg, sup)`: runs instead of the row's function (a fanned-out phase's
    coordinator: its shards, then their merge); the markers are the same."""
    with phase_lock(cfg, phase):
        return _run_locked(cfg, phase, sup, force, on_progress, force_token, options or {}, upstream, body)


def _run_locked(cfg: PipelineConfig, phase: str, sup: Supervisor | None, force: bool,
                on_progress: progress.ProgressFn | None, force_token: str | None, options: dict, upstream,
                body) -> DoneMarker:
    if upstream is FROM_RUN_DIR or (upstream is None and upstream_of(cfg, phase)):
        upstream = require_upstream(cfg, phase)  # given none where one is needed: the run dir's, or a clear error
    marker = done_marker(cfg, phase)
    started = read_json(_started_path(cfg, phase)) or {}
    if force and (force_token is None or marker is None or marker.force_token != force_token):
        clear_phase(cfg, phase)
    elif marker and is_done(cfg, phase, upstream):
        progress.note(phase, f"already done for this config (output {marker.fingerprint}); skipped")
        return marker
    elif started and started.get("upstream") != upstream:
        # Output (finished or partial) derived from an upstream that has since been redone: stale.
        clear_phase(cfg, phase)
    _marker_path(cfg, phase).unlink(missing_ok=True)
    resuming = _started_path(cfg, phase).exists()  # an earlier attempt left (partial) output
    atomic_write_json(_started_path(cfg, phase), {"upstream": upstream, "at": time.time()})
    sup = sup or supervisor(cfg)
    fn = body or phase_table.get(phase).function()
    t0 = time.time()
    progress.emit(progress.Event(phase, progress.START, message="started, resuming what an earlier attempt left"
                                 if resuming else "started"))
    log.info("phase %s: starting (%s)", phase, "resuming a previous attempt" if resuming else "fresh")
    try:
        with progress.subscribed(progress.counts(phase, on_progress)) if on_progress else contextlib.nullcontext():
            summary = fn(cfg, sup, **options)  # the phase contract (eagle3.phase_table.Phase.run)
    except BaseException as e:
        sig = progress.interrupting_signal(e)
        message = progress.INTERRUPTED + sig if sig else progress.error_line(e)
        progress.emit(progress.Event(phase, progress.END, ok=False, message=message))
        raise
    finally:
        sup.stop_all()  # whatever the phase left running is ours to end
    if not isinstance(summary, PhaseSummary):
        raise TypeError(f"phase {phase!r} ({phase_table.get(phase).run}) returned {type(summary).__name__}; "
                        "a phase returns an eagle3.phases.PhaseSummary")
    marker = DoneMarker.sealed(phase=phase, config=cfg.fingerprint(phase), upstream=upstream, code=code_version(phase),
                               started_at=t0, finished_at=time.time(), summary=summary.to_dict(),
                               force_token=force_token if force else None)
    atomic_write_json(_marker_path(cfg, phase), marker.to_dict())
    progress.emit(progress.Event(phase, progress.END, message=f"output {marker.fingerprint}"))
    log.info("phase %s: done in %.1f s (output %s)", phase, marker.finished_at - t0, marker.fingerprint)
    return marker

