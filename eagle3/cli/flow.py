"""`eagle3 run`: the whole pipeline flow, and what it prints when it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .. import phase_table, progress
from ..config.fanout import fanned_phases
from ..errors import ConfigError
from .app import app
from ..errors import PipelineError
from .common import (ConfigArg, WaitOption, check_phases, end, err, bad_input, fail_with, load_cfg, out, prefect_defaults, raise_interrupt, recover, take_lease)
from .phases import print_report

@app.command()
def run(config: Path = ConfigArg,
        only: Optional[str] = typer.Option(None, "--only", help=f"Run just this phase ({', '.join(phase_table.names())})."),
        from_: Optional[str] = typer.Option(None, "--from", help="Start at this phase; earlier ones must be done."),
        force: list[str] = typer.Option([], "--force", help="Redo this phase even if done (repeatable)."),
        doctor: bool = typer.Option(True, "--doctor/--no-doctor", help="Run the preflight doctor first."),
        wait: float = WaitOption,
        ) -> None:
    """Run the pipeline flow (phases with a GPU handoff between each two).

    Order: the run's leases (run dir, GPUs) -> the recovery handoff (ends what a dead earlier run
    left) -> the run's Prefect server if none is configured, while the doctor's engine probes are
    asked beside it -> the flow (doctor, phases, handoffs)."""
    check_phases([p for p in (only, from_) if p] + list(force), "--only/--from/--force")
    if only and from_:
        bad_input("--only and --from cannot be combined; pick one")
    cfg = load_cfg(config)
    prefect_defaults()
    from ..doctor import warm_engine_probes
    from ..phase_runner import supervisor
    from ..progress.display import progress_display

    # SIGTERM (a scheduler, `kill`) must unwind like Ctrl-C so the finally below ends our services.
    signal.signal(signal.SIGTERM, raise_interrupt)
    sup = supervisor(cfg)
    fanned = fanned_phases(cfg, phase_table.select(only, from_))
    if fanned and not os.environ.get("PREFECT_API_URL"):
        bad_input(f"fanout: {', '.join(fanned)} run as shards on the node pools of a Prefect server, and PREFECT_API_URL "
             "is not set: point it at the server the nodes' workers use (e.g. export "
             "PREFECT_API_URL=http://HEAD:4200/api), or remove the fanout section to run on this node")
    if fanned:
        from tasks.fanout import check_pools  # the orchestration layer; the core stays Prefect-free

        try:
            check_pools(cfg, fanned)  # before any lease, handoff or server: a missing pool starts nothing
        except ConfigError as e:
            fail_with(e)
    with contextlib.ExitStack() as stack:
        # A run that fans out takes this node's GPU leases only around what runs here (flows/pipeline.py).
        take_lease(stack, cfg.run_dir, [] if fanned else list(cfg.gpus), wait)
        try:
            from flows.local_server import api_server  # the orchestration layer; the core stays Prefect-free
            from flows.pipeline import eagle3_pipeline

            with progress_display():  # live on a terminal, a line at least every 30 s otherwise
                recover(cfg, sup)
                # The preflight's engine probes, asked while the run's Prefect server starts (both take seconds).
                warming = warm_engine_probes(cfg) if doctor else None
                stack.enter_context(api_server(sup, cfg.layout.logs))
                if warming is not None:
                    join_engine_probes(warming)
                state = eagle3_pipeline(config_path=str(config.resolve()), only=only, from_=from_, force=list(force),
                                        doctor=doctor, return_state=True)
        except KeyboardInterrupt as e:
            err.print("interrupted: stopping the services this pipeline started")
            end(e)
        finally:
            # Everything in the registry is this run's now (it holds the lease). Its own Prefect server
            # is left to api_server's exit, which first sends the run's last log records to it.
            for o in sup.sweep(cfg.handoff.grace_s):
                if o.members:
                    err.print(f"stopped leftover {o.name} (group {o.pgid}) with {o.signal}")
    if not state.is_completed():
        fail_with(PipelineError(ended_line(cfg, state.type.value, state.message or "")))
    print_outcome(cfg)


def join_engine_probes(warming) -> None:
    """Wait for the preflight's engine probes, saying so while they run (a cold one is an engine's whole
    import: ~20 s on the H200 machine)."""
    if warming.is_alive():
        t0 = time.monotonic()
        progress.waiting("run", "waiting for the engines' answers to the preflight's questions (their first imports)", 0)
        warming.join()
        progress.note("run", f"the engines answered after {time.monotonic() - t0:.1f} s more")


def print_outcome(cfg) -> None:
    from ..phase_runner import done_marker

    for phase in phase_table.names():
        marker = done_marker(cfg, phase)
        if marker:
            out.print(f"[green]done[/] {phase:8s} output {marker.fingerprint}  ({escape(str(cfg.phase_dir(phase)))})")
    for row in phase_table.table():
        print_report(cfg, row)
        if row.report and (report := cfg.phase_dir(row.name) / row.report).is_file():
            out.print(f"report: {report}\nfiles:  {', '.join(sorted(p.name for p in report.parent.iterdir() if p.is_file()))}",
                      markup=False, highlight=False, soft_wrap=True)


def ended_line(cfg, state: str, message: str) -> str:
    """The run's last line: the step that failed (run.json) and its first cause, once."""
    from ..fsio import read_json

    record = read_json(cfg.layout.run_record) or {}
    where = f" in {record['phase']}" if record.get("phase") else ""
    return f"pipeline {cfg.name} ended {state}{where}: {message.removeprefix('Flow run encountered an exception: ')}"
