"""Commands that look at or clean up a node and a run: handoff, gpus, doctor, status."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..config import DEFAULT_CONFIG, owned_dir_problem
from ..errors import ConfigError, HandoffError, PipelineError
from .app import app
from .common import ConfigArg, WaitOption, check_phases, end, err, bad_input, fail_with, load_cfg, out, take_lease

def _parse_gpus(text: str) -> list[int]:
    if text.strip().lower() == "none":
        return []
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        bad_input(f"--gpus: expected comma-separated GPU indices or 'none', got {text!r}")
    if not ids or min(ids) < 0:
        bad_input(f"--gpus: expected comma-separated GPU indices >= 0 or 'none', got {text!r}")
    return ids


@app.command()
def handoff(config: Optional[Path] = typer.Argument(
                None, help="Pipeline config: its handoff section, GPUs and ports. Without one: default settings "
                           "and every GPU NVML sees."),
            run_dir: Optional[Path] = typer.Option(
                None, "--run-dir", help="Run dir whose registry names the processes to stop (default: the config's)."),
            after: str = typer.Option("start", "--after", help="Phase just finished ('start' = before the first); "
                                                               "picks the ports that must be free."),
            gpus: Optional[str] = typer.Option(None, "--gpus", help="GPU indices to prove free, e.g. 0,1 "
                                                                     "(overrides the config); 'none' skips the GPU check."),
            port: list[int] = typer.Option([], "--port", help="Another port that must have no listener (repeatable)."),
            as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of tables."),
            wait: float = WaitOption,
            ) -> None:
    """Stop what the pipeline started, purge its stale state and prove the GPUs free; exit 1 if they are not,
    exit 3 if a live run holds the run dir (its services are its own to stop)."""
    from ..config import Handoff, load_config as _load_unchecked
    from ..handoff.core import ports_for, run_handoff
    from ..phase_table import next_phase
    from ..handoff.view import renderable

    if config is None and run_dir is None:
        bad_input("give a CONFIG or --run-dir DIR (the run dir whose services the handoff stops)")
    if after != "start":
        check_phases([after], "--after")
    cfg = None
    if config is not None:
        try:
            cfg = _load_unchecked(config, check_files=False)
        except ConfigError as e:
            fail_with(e)
    if run_dir is not None and not run_dir.is_dir():  # a typo must not pass as "nothing to stop"
        bad_input(f"--run-dir: {run_dir} is not a directory")
    if run_dir is not None and (why := owned_dir_problem(run_dir)):  # the report is written there
        bad_input(f"--run-dir: {why}")
    run_dir = run_dir or cfg.run_dir
    before = next_phase(after)
    ids = _parse_gpus(gpus) if gpus is not None else (list(cfg.gpus) if cfg else None)
    ports = sorted(set(ports_for(cfg, after, before) if cfg else []) | set(port))
    stack = contextlib.ExitStack()
    take_lease(stack, run_dir, ids or [], wait)
    try:
        report = run_handoff(run_dir, cfg.handoff if cfg else Handoff(), ids, ports,
                             label=f"{after}-to-{before or 'end'}").to_dict()
        refused = None
    except HandoffError as e:
        if e.report is None:
            fail_with(e)
        report, refused = e.report.to_dict(), e
    except PipelineError as e:
        fail_with(e)
    finally:
        stack.close()
    if as_json:
        out.print_json(json.dumps(report, default=str))
    else:
        out.print(renderable(report))
    if refused:
        err.print(f"[bold red]handoff refused[/]: {escape('; '.join(report['problems']))}", highlight=False,
                  soft_wrap=True)
    end(refused)


@app.command("gpus")
def gpus_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Show each NVIDIA GPU: v2 memory used/reserved/free, utilisation and the processes on it."""
    from rich.table import Table

    from ..handoff.gpus import NvmlBackend, NvmlUnavailable

    try:
        with NvmlBackend() as nv:
            states, source = nv.snapshot(), nv.describe()
    except NvmlUnavailable as e:
        if as_json:
            out.print_json(json.dumps({"available": False, "reason": str(e), "gpus": []}))
        else:
            out.print(f"No NVIDIA GPU here: {e}")
        return
    except PipelineError as e:
        fail_with(e)
    if as_json:
        out.print_json(json.dumps({"available": True, "source": source, "gpus": [s.to_dict() for s in states]}))
        return
    if not states:
        out.print(f"No NVIDIA GPU here: {source} reports 0 devices")
        return
    t = Table(title=source, title_justify="left")
    for col in ("GPU", "name", "UUID", "PCI", "minor", "used MiB", "reserved MiB", "free MiB", "total MiB", "util %",
                "processes"):
        t.add_column(col, overflow="fold")
    for s in states:
        procs = ", ".join(f"{p.pid} ({p.kind}, {'?' if p.used_mib is None else f'{p.used_mib:.0f} MiB'})"
                          for p in s.processes) or "-"
        t.add_row(str(s.index), s.name, s.uuid, s.pci_bus_id, str(s.minor), f"{s.used_mib:.0f}", f"{s.reserved_mib:.0f}",
                  f"{s.free_mib:.0f}", f"{s.total_mib:.0f}", "-" if s.util_gpu is None else str(s.util_gpu), procs)
    out.print(t)


@app.command()
def doctor(config: Path = ConfigArg,
           as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
           engines: bool = typer.Option(True, "--engines/--no-engines",
                                        help="Also ask each engine environment about the target (seconds each)."),
           wait: float = WaitOption) -> None:
    """Preflight: catch what would otherwise surface after a long model load. Exit 1 on any FAIL,
    3 if a live run holds the run dir (its engine probes would share that run's registry)."""
    from dataclasses import asdict

    from ..doctor import FAIL, WARN, DoctorFailed, failed, run_doctor

    cfg = load_cfg(config)
    with contextlib.ExitStack() as stack:
        take_lease(stack, cfg.run_dir, [], wait)
        checks = run_doctor(cfg, engines=engines)
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        colour = {FAIL: "red", WARN: "yellow"}
        for c in checks:
            fix = f"  [dim]fix: {escape(c.fix)}[/]" if c.fix and c.status != "PASS" else ""
            out.print(f"[{colour.get(c.status, 'green')}]{c.status}[/] {escape(c.name):24s} {escape(c.reason)} "
                      f"[dim]({c.seconds:.1f} s)[/]{fix}", highlight=False, soft_wrap=True)
    end(DoctorFailed(checks) if failed(checks) else None)


@app.command()
def status(target: Path = typer.Argument(DEFAULT_CONFIG, help="A pipeline config, or the run dir of a run.",
                                         show_default="configs/smollm2-cpu.yaml"),
           as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
           watch: bool = typer.Option(False, "--watch", help="Redraw every --every seconds until the run ends."),
           every: float = typer.Option(2.0, "--every", min=0.2, help="Seconds between redraws with --watch."),
           ) -> None:
    """What a run is doing (from another terminal; no Prefect server needed): phase, progress, ETA,
    services, last handoff, failures, disk; for an ended run its outcome and the command that resumes it."""
    from ..run.status import collect, render, resolve

    try:
        run_dir, config_path = resolve(target)
    except ConfigError as e:
        fail_with(e)
    while True:
        s = collect(run_dir, config_path)
        if watch and out.is_terminal and not as_json:
            out.clear()
        if as_json:
            print(json.dumps(s, default=str), flush=True)
        else:
            out.print(render(s), markup=False, highlight=False, soft_wrap=True)
        if not watch or s["status"] != "running":
            return
        try:
            time.sleep(every)
        except KeyboardInterrupt:
            return
        if not as_json and not out.is_terminal:
            out.print("", markup=False)
