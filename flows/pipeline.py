"""The pipeline flow: four phases with a mandatory GPU handoff before the first, between each
two, and after the last. Retrying a failed flow run, or running it again, skips finished phases
(their results are cached across runs); `force` redoes a phase and, through the upstream
fingerprint in the cache key, everything downstream of it."""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path
from typing import Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run

from eagle3 import phase_table
from eagle3.config import load_config, remote_binds
from eagle3.config.pinned import pin
from eagle3.errors import GateError
from eagle3.process.lease import LeaseBusy, hold
from eagle3.phase_runner import is_done, supervisor, upstream_fingerprint
from eagle3.progress.display import unattended_lines
from eagle3.run.record import recording
from tasks.artifact_keys import artifact_key
from tasks.fanout import check_pools, fanned_phases
from tasks.handoff import gpu_handoff
from tasks.logs import quiet_console_restatements, route_pack_logs
from tasks.phases import phase_task
from tasks.preflight import preflight
from tasks.secrets import provide_api_keys

REPO = Path(__file__).resolve().parent.parent

# Enumerated, so the parameter schema has an enum: the UI offers choices, and the server refuses a
# flow run whose parameters are not among them when the run is created (deployments enforce the schema).
# Parameter descriptions come from the flows' docstrings ("Args:"), which Prefect puts in the schema.
# Read when the flow is imported: a worker's flow-run process has its phase table by then.
Phase = Literal[phase_table.names()]


def _config_name(config_path: str | None) -> str:
    if not config_path:
        return "eagle3"
    try:
        path = Path(config_path) if Path(config_path).exists() else REPO / config_path
        return load_config(path, check_files=False).name
    except Exception:  # noqa: BLE001 - a name must never fail the run; the flow reports a bad config itself
        return Path(config_path).stem


def run_name(config_path: str | None, phases: list[str], force: list[str] | None = None) -> str:
    """`<config name>: <phases>[ force <phases>]`, e.g. "tiny-cpu: datagen..bench", "tiny-cpu: train"."""
    span = phases[0] if len(phases) == 1 else f"{phases[0]}..{phases[-1]}"
    return f"{_config_name(config_path)}: {span}" + (f" force {','.join(force)}" if force else "")


def pipeline_run_name() -> str:
    p = flow_run.parameters or {}
    try:
        phases = phase_table.select(p.get("only"), p.get("from_"))
    except Exception:  # noqa: BLE001 - validation reports bad phases; the name must not fail first
        phases = list(phase_table.names())
    return run_name(p.get("config_path"), phases, p.get("force"))


def teardown(flow, flow_run, state) -> None:
    """On crash or cancellation: Prefect does not kill child processes, so end what we own.
    (Parameter names matter: after a worker kills the run, Prefect calls hooks by keyword.)"""
    config_path = (flow_run.parameters or {}).get("config_path")
    if not config_path:
        return
    if not Path(config_path).is_absolute() and not Path(config_path).exists():
        config_path = REPO / config_path  # hooks may run outside the deployment's working directory
    cfg = load_config(config_path, check_files=False)
    if (pinned := cfg.layout.pinned_config(str(flow_run.id))).is_file():
        cfg = load_config(pinned, check_files=False)  # what this run started with, not the YAML's edits since
    from prefect.logging.loggers import flow_run_logger

    logger = flow_run_logger(flow_run, flow)
    try:
        # Ours to end only while no other live run holds the run dir (this one may be a run that
        # was cancelled while it waited for the lease; the holder's services are not its own).
        with hold(cfg.run_dir):
            outcomes = supervisor(cfg).sweep(cfg.handoff.grace_s)
    except LeaseBusy as e:
        logger.info("teardown on %s: nothing stopped (%s)", state.name if state else "?", e)
        return
    logger.info(
        "teardown on %s: %d registered service(s) stopped%s", state.name if state else "?", len(outcomes),
        "".join(f"; {o.name} (group {o.pgid}) {'clean' if o.clean else f'SURVIVORS {o.survivors}'}" for o in outcomes))


def result_storage(cfg) -> Path:
    # Cached phase results live with the run dir: deleting a run forgets its cache too. A Path,
    # not an unsaved LocalFileSystem block: Prefect rejects unsaved blocks as task result storage.
    return cfg.layout.prefect_results


def run_phases(config_path: str, phases: list[str], force: list[str], doctor: bool = True,
               lease_wait_s: float = 0.0) -> dict:
    """Under the run's leases (run dir, GPUs), with the config pinned for the run (eagle3.config.pinned):
    the start handoff first (it ends what a dead earlier run left), then the doctor, then each phase
    with a handoff after it. Recorded for `eagle3 status`
    (run.json, progress.json) by the lease holder only, with progress lines in the run's log unless a
    terminal already shows them (`eagle3 run`)."""
    route_pack_logs()
    quiet_console_restatements()
    cfg = load_config(config_path)
    check_pools(cfg, phases, flow_run.id)
    # A run that fans out holds this node's GPUs only around what runs here (its shards may run on this
    # node too, through its pool's worker, under the same node-wide GPU leases).
    gpus = [] if fanned_phases(cfg, phases) else list(cfg.gpus)
    with hold(cfg.run_dir, gpus, lease_wait_s):
        # Pinned under the lease: every task, shard, handoff and retry of this run reads the pinned copy.
        pinned = pin(config_path, str(flow_run.id))
        for line in pinned.changes:
            get_run_logger().warning("config changed since the run dir's last run: %s", line)
        with recording(pinned.cfg, config_path, phases, pinned=str(pinned.path)), \
                unattended_lines(get_run_logger().info):
            return _run_phases(pinned.cfg, str(pinned.path), phases, force, doctor)


def _publish(cfg, phase: str, details: dict) -> None:
    """The artifacts a phase's row names (`publish`: e.g. the benchmark's table, report and trend)."""
    row = phase_table.get(phase)
    if row.publish and details:
        module, name = row.publish.split(":", 1)
        getattr(importlib.import_module(module), name)(cfg.name, details)


def _here(cfg, phase: str):
    """This node's GPU leases around a step that uses them here: every step of a run that does not
    fan out (its leases are held for the whole run already), and the unsharded phases and handoffs of
    one that does."""
    if cfg.fanout is None or fanned_phases(cfg, [phase]):
        return contextlib.nullcontext()
    return hold(cfg.run_dir, list(cfg.gpus))


def _run_phases(cfg, config_path: str, phases: list[str], force: list[str], doctor: bool) -> dict:
    logger = get_run_logger()
    for line in remote_binds(cfg):  # allowed by the config (allow_remote); said at every run, doctor or not
        logger.warning("network exposure: %s", line)
    provide_api_keys(cfg)
    token = str(flow_run.id or "")
    storage = result_storage(cfg)
    results: dict[str, dict] = {}
    with _here(cfg, "start"):
        gpu_handoff(config_path, after="start", before=phases[0] if phases else None)
    if doctor:
        preflight(config_path)
    for phase in phases:
        upstream = upstream_fingerprint(cfg, phase, {p: r["fingerprint"] for p, r in results.items()})
        forced = phase in force
        refresh = forced or not is_done(cfg, phase)  # a cache entry is only trusted while the output exists
        try:
            with _here(cfg, phase):
                results[phase] = phase_task.with_options(refresh_cache=refresh, result_storage=storage)(
                    config_path, phase, upstream=upstream, force=forced, force_token=token)
        except GateError as e:
            if getattr(e, "summary", None):  # e.g. a benchmark regression: its table is what the operator needs
                _publish(cfg, phase, e.summary.details)
            raise
        with _here(cfg, "end"):
            gpu_handoff(config_path, after=phase)
    rows = "\n".join(f"| {p} | {r['fingerprint']} |" for p, r in results.items())
    create_markdown_artifact(key=artifact_key(cfg.name, "pipeline"),
                             markdown=f"### {cfg.name}: phases run\n\n| phase | output |\n|---|---|\n{rows}\n")
    for phase, result in results.items():  # also when a phase came from the cache
        _publish(cfg, phase, result.get("summary", {}).get("details", {}))
    logger.info("pipeline %s: %s done", cfg.name, ", ".join(results))
    return results


@flow(name="eagle3-pipeline", flow_run_name=pipeline_run_name, on_crashed=[teardown], on_cancellation=[teardown],
      validate_parameters=True)
def eagle3_pipeline(config_path: str, only: Phase | None = None, from_: Phase | None = None,
                    force: list[Phase] | None = None, doctor: bool = True, lease_wait_s: float = 0.0) -> dict:
    """Run the EAGLE-3 pipeline (all phases, `only` one, or `from_` one on), with a GPU handoff
    before, between and after the phases.

    Args:
        config_path: Pipeline config (YAML); a relative path resolves against the repo root on the node.
        only: Run just this phase (its upstream phase must be done).
        from_: Start at this phase and run the phases after it.
        force: Redo these phases even if done, and every phase downstream of them.
        doctor: Run the preflight doctor first.
        lease_wait_s: If another run holds the run dir or one of its GPUs, wait up to this many seconds
            for it, then fail naming it (0: fail at once).
    """
    return run_phases(str(Path(config_path).resolve()), phase_table.select(only, from_), list(force or []), doctor,
                      lease_wait_s)
