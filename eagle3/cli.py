"""`eagle3` command line. Each command is a thin shell over the core; exit 2 means bad input."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import click
import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.markup import escape

from . import phase_table
from .config import DEFAULT_CONFIG, load_config, owned_dir_problem, remote_binds
from .errors import ConfigError, HandoffError, PipelineError, echo

class _Commands(TyperGroup):
    """The fixed commands, plus `eagle3 <phase>` for each row of the phase table, read when the
    command line is parsed (EAGLE3_PHASE_TABLE may name another table)."""

    def _phases(self) -> tuple[str, ...]:
        try:
            return phase_table.names()
        except ConfigError:
            return ()  # a bad EAGLE3_PHASE_TABLE: `eagle3 run` says why; --help still works

    def list_commands(self, ctx) -> list[str]:
        fixed = super().list_commands(ctx)
        return fixed + [name for name in self._phases() if name not in fixed]

    def get_command(self, ctx, name):
        found = super().get_command(ctx, name)
        if found is None and name in self._phases():
            return phase_command(phase_table.get(name))
        return found


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True,
                  help="Run the EAGLE-3 drafter pipeline (data generation -> hidden states -> training -> "
                       "speculative-decode benchmark) with a proven GPU handoff between phases.")
out = Console()
err = Console(stderr=True)

ConfigArg = typer.Argument(DEFAULT_CONFIG, help="Pipeline config (YAML). Default: the tiny CPU rehearsal.",
                           show_default="configs/tiny-cpu.yaml")


def fail(message: str, code: int = 2) -> None:
    # escape(): messages quote config values, and "[/x]" in one would be a rich markup error
    err.print(f"[bold red]error[/]: {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _load(config: Path):
    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail(str(e))
    for line in remote_binds(cfg):  # allowed by the config (allow_remote), said at every use of it
        err.print(f"[bold yellow]warning[/]: {escape(line)}", highlight=False, soft_wrap=True)
    return cfg


@app.command()
def validate(config: Path = ConfigArg) -> None:
    """Validate a config completely; exit 0 if valid, 2 with every problem listed."""
    cfg = _load(config)
    out.print(f"[green]valid[/]: {escape(str(config))} (pipeline '{cfg.name}', run dir {escape(str(cfg.run_dir))}, "
              f"{'CPU rehearsal' if cfg.cpu_rehearsal else f'GPUs {cfg.gpus}'})")


WaitOption = typer.Option(0.0, "--wait", min=0, metavar="SECONDS",
                          help="If another run holds this run dir or one of its GPUs, wait up to SECONDS for it "
                               "instead of refusing at once (exit 3).")


def _lease(stack: contextlib.ExitStack, run_dir: Path, gpus: list[int], wait_s: float) -> None:
    """Take the run dir's lease (and the GPUs') before anything else touches the run dir; a run
    that holds them already is named and nothing is started or stopped (exit 3); a run dir or lock
    dir another user could have written is refused, naming the path, owner, mode and fix (exit 2)."""
    from .process.lease import LeaseBusy, hold

    try:
        stack.enter_context(hold(run_dir, gpus, wait_s))
    except LeaseBusy as e:
        fail(str(e), code=LeaseBusy.exit_code)
    except ConfigError as e:  # the run dir or the lock dir is not provably the user's (owned.NotOwned)
        fail(str(e))


def _recover(cfg, sup, ports: list[int] | None = None) -> None:
    """The run's first handoff: end what a dead earlier run of this run dir left, before the doctor."""
    from .handoff.core import recovery_handoff
    from .handoff.view import summary_line
    from .progress import watched_by
    from .progress_display import Display

    try:
        report = recovery_handoff(cfg, supervisor=sup, ports=ports)
    except HandoffError as e:
        fail(summary_line(e.report) if e.report is not None else str(e), code=1)
    if not watched_by(Display):  # a progress display already shows the handoff's line
        err.print(summary_line(report), highlight=False, soft_wrap=True, markup=False)


def _replaceable(directory: Path, argument: str) -> None:
    """An output directory a command replaces as a whole: never one the pack may not own (/, $HOME,
    its checkout, ...), never a directory of other files."""
    why = owned_dir_problem(directory, purpose="the command replaces it as a whole: give a new directory")
    if why:
        fail(f"{argument}: {why}")
    if directory.is_dir() and not (directory / "config.json").is_file() and any(directory.iterdir()):
        fail(f"{argument}: {directory} holds other files (and no config.json); the command would replace it as a "
             "whole: give a new or empty directory")


def _check_phases(names: list[str], option: str) -> None:
    for name in names:
        try:
            phase_table.check(name, option)
        except ConfigError as e:
            fail(str(e))


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
    left) -> the run's Prefect server if none is configured -> the flow (doctor, phases, handoffs)."""
    _check_phases([p for p in (only, from_) if p] + list(force), "--only/--from/--force")
    if only and from_:
        fail("--only and --from cannot be combined; pick one")
    cfg = _load(config)
    _prefect_defaults()
    from .pipeline import supervisor
    from .progress_display import progress_display

    # SIGTERM (a scheduler, `kill`) must unwind like Ctrl-C so the finally below ends our services.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    sup = supervisor(cfg)
    with contextlib.ExitStack() as stack:
        _lease(stack, cfg.run_dir, list(cfg.gpus), wait)
        try:
            from flows.local_server import api_server  # the orchestration layer; the core stays Prefect-free
            from flows.pipeline import eagle3_pipeline

            with progress_display():  # live on a terminal, a line at least every 30 s otherwise
                _recover(cfg, sup)
                stack.enter_context(api_server(sup, cfg.layout.logs))
                state = eagle3_pipeline(config_path=str(config.resolve()), only=only, from_=from_, force=list(force),
                                        doctor=doctor, return_state=True)
        except KeyboardInterrupt:
            err.print("interrupted: stopping the services this pipeline started")
            raise typer.Exit(130)
        finally:
            # Everything in the registry is this run's now (it holds the lease). Its own Prefect server
            # is left to api_server's exit, which first sends the run's last log records to it.
            for o in sup.sweep(cfg.handoff.grace_s):
                if o.members:
                    err.print(f"stopped leftover {o.name} (group {o.pgid}) with {o.signal}")
    if not state.is_completed():
        fail(f"pipeline {cfg.name} ended {state.type.value}: {state.message}", code=1)
    _print_outcome(cfg)


@contextlib.contextmanager
def _phase_command(cfg, config: Path, sup, row: phase_table.Phase, wait_s: float, own_server: bool):
    """What every single-phase command shares: the run's leases, then the recovery handoff (for this
    phase's ports; none when the phase uses someone else's server), SIGTERM unwinding like Ctrl-C,
    errors mapped to exit codes (2 bad input, 1 failure, 3 busy, 130 interrupted) with what a rerun
    keeps, and the services the phase started ended. Recorded for `eagle3 status` (run.json,
    progress.json) like a pipeline run. The phase itself runs through eagle3.pipeline.run_phase
    (its lock, upstream check and markers), as in a pipeline run."""
    from .errors import GateError
    from .progress_display import progress_display
    from .runstate import recording

    signal.signal(signal.SIGTERM, _raise_interrupt)
    with contextlib.ExitStack() as stack:
        _lease(stack, cfg.run_dir, list(cfg.gpus), wait_s)
        # The same display as `eagle3 run`: live on a terminal; off one (a file, a scheduler's log) a
        # line per step and a heartbeat whenever nothing was printed for the interval.
        stack.enter_context(progress_display(start=f"{row.name} alone (`eagle3 {row.name}`)"))
        try:
            with recording(cfg, str(config.resolve()), [row.name]):
                _recover(cfg, sup, cfg.phase_ports(row.name) if own_server else [])
                yield
        except KeyboardInterrupt:
            err.print(f"interrupted: {row.keeps}")
            raise typer.Exit(130)
        except ConfigError as e:
            fail(str(e))
        except GateError as e:
            _print_report(cfg, row)
            fail(str(e), code=1)
        except PipelineError as e:
            fail(f"{e}\n(retryable: {e.retryable}; {row.keeps})", code=1)
        finally:
            sup.stop_all()


def _run_one_phase(row: phase_table.Phase, config: Path, force: bool, wait: float, options: dict) -> None:
    import logging

    cfg = _load(config)
    from .pipeline import run_phase, supervisor

    given = {k: v for k, v in options.items() if v is not None}
    foreign = any(o.foreign_server for o in row.options if o.keyword in given)
    phase_log = logging.getLogger(f"eagle3.{row.name}")  # what the phase reports (kept/redone files, leftovers)
    phase_log.setLevel(logging.INFO)
    phase_log.addHandler(logging.StreamHandler())
    sup = supervisor(cfg)
    with _phase_command(cfg, config, sup, row, wait, own_server=not foreign):
        marker = run_phase(cfg, row.name, sup, force=force, options=given)
    out.print(f"[green]{row.name}[/]: {escape(marker['summary']['headline'])}", highlight=False, soft_wrap=True)
    _print_report(cfg, row)


def _print_report(cfg, row: phase_table.Phase) -> None:
    report = cfg.phase_dir(row.name) / row.report if row.report else None
    if report is not None and report.is_file():
        out.print(report.read_text(), markup=False, highlight=False, soft_wrap=True)


def phase_command(row: phase_table.Phase) -> click.Command:
    """`eagle3 <phase> [CONFIG] [--force] [--wait S]` plus the row's own options, from its table row."""
    def command(**kw) -> None:
        config, force, wait = kw.pop("config"), kw.pop("force"), kw.pop("wait")
        _run_one_phase(row, config, force, wait, kw)

    P = inspect.Parameter
    params = [P("config", P.POSITIONAL_OR_KEYWORD, default=ConfigArg, annotation=Path),
              P("force", P.KEYWORD_ONLY, annotation=bool, default=typer.Option(
                  False, "--force", help="Discard this phase's output and redo it (its DONE marker goes first, so an "
                                         "interrupted redo leaves the phase not done).")),
              P("wait", P.KEYWORD_ONLY, annotation=float, default=WaitOption)]
    params += [P(o.keyword, P.KEYWORD_ONLY, annotation=Optional[str], default=typer.Option(None, o.flag, help=o.help))
               for o in row.options]
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {}
    single = typer.Typer(add_completion=False)
    single.command(row.name, help=row.help or f"Phase {row.name} alone: {row.produces}.")(command)
    return typer.main.get_command(single)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _prefect_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")



def _print_outcome(cfg) -> None:
    from .pipeline import done_marker

    for phase in phase_table.names():
        marker = done_marker(cfg, phase)
        if marker:
            out.print(f"[green]done[/] {phase:8s} output {marker['fingerprint']}  ({escape(str(cfg.phase_dir(phase)))})")
    for row in phase_table.table():
        _print_report(cfg, row)
        if row.report and (report := cfg.phase_dir(row.name) / row.report).is_file():
            out.print(f"report: {report}\nfiles:  {', '.join(sorted(p.name for p in report.parent.iterdir() if p.is_file()))}",
                      markup=False, highlight=False, soft_wrap=True)


@app.command("make-tiny-model")
def make_tiny_model(
        directory: Path = typer.Argument(..., help="Model directory to write (replaced if built differently)."),
        engine_python: Optional[Path] = typer.Option(
            None, "--engine-python", help="Interpreter of the engine venv (needs torch, transformers, tokenizers). "
                                          "Default: the one configs/tiny-cpu.yaml names (.venv-engine/bin/python)."),
        constant: bool = typer.Option(False, "--constant", help="Zero model.norm.weight: greedy decoding always "
                                                                "emits token 0 (for the 100 %-acceptance check)."),
        layers: int = typer.Option(8, "--layers", min=1, help="Decoder layers (>= 7 keeps the default aux layers distinct)."),
        seed: int = typer.Option(0, "--seed", help="Weight seed; the same seed gives byte-identical files."),
        force: bool = typer.Option(False, "--force", help="Rebuild even if DIR is already up to date."),
        ) -> None:
    """Write a tiny random Llama (8 layers, hidden 128, 4k byte-level BPE vocab, chat template) for CPU rehearsals."""
    from .config import EngineEnv
    from .tinymodel import TinyModelSpec, default_engine, ensure_tiny_model, is_current

    _replaceable(directory, "DIR")
    try:
        engine = default_engine()
        if engine_python is not None:
            engine = EngineEnv(python=engine_python.absolute(), env=engine.env)
        spec = TinyModelSpec(layers=layers, seed=seed, constant=constant)
        fresh = not force and is_current(directory, spec)
        path = ensure_tiny_model(directory, engine, spec, force=force)
    except ConfigError as e:
        fail(str(e))
    except PipelineError as e:
        fail(str(e), code=1)
    out.print(f"[green]{'up to date' if fresh else 'built'}[/]: {escape(str(path))}")


@app.command("make-prompts")
def make_prompts(
        directory: Path = typer.Argument(..., help="Dir to write train.jsonl and heldout.jsonl into."),
        train: int = typer.Option(4096, "--train", min=1, help="Prompts for data generation (train.jsonl)."),
        heldout: int = typer.Option(512, "--heldout", min=1, help="Prompts for the benchmark only (heldout.jsonl)."),
        seed: int = typer.Option(0, "--seed", help="Generator seed; the same arguments give byte-identical files."),
        ) -> None:
    """Write a varied, locally made prompt set with a fixed held-out split (no download): the split of a prompt
    depends on its text alone, so a held-out prompt is never a data-generation prompt, whatever the counts."""
    from .promptgen import generate, write

    why = owned_dir_problem(directory, purpose="the command writes train.jsonl and heldout.jsonl there")
    if why:
        fail(f"DIR: {why}")
    others = sorted(p.name for p in directory.iterdir() if p.name not in ("train.jsonl", "heldout.jsonl")) \
        if directory.is_dir() else []
    if others:
        fail(f"DIR: {directory} holds other files ({', '.join(others[:5])}); give a new or empty directory")
    try:
        paths = write(directory, generate(train, heldout, seed))
    except ConfigError as e:
        fail(str(e))
    out.print(f"[green]prompts[/]: {train} in {escape(str(paths[0]))}, {heldout} held out in {escape(str(paths[1]))}")


def _parse_gpus(text: str) -> list[int]:
    if text.strip().lower() == "none":
        return []
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--gpus: expected comma-separated GPU indices or 'none', got {text!r}")
    if not ids or min(ids) < 0:
        fail(f"--gpus: expected comma-separated GPU indices >= 0 or 'none', got {text!r}")
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
    from .config import Handoff, load_config as _load_unchecked
    from .handoff.core import ports_for, run_handoff
    from .phase_table import next_phase
    from .handoff.view import renderable

    if config is None and run_dir is None:
        fail("give a CONFIG or --run-dir DIR (the run dir whose services the handoff stops)")
    if after != "start":
        _check_phases([after], "--after")
    cfg = None
    if config is not None:
        try:
            cfg = _load_unchecked(config, check_files=False)
        except ConfigError as e:
            fail(str(e))
    if run_dir is not None and not run_dir.is_dir():  # a typo must not pass as "nothing to stop"
        fail(f"--run-dir: {run_dir} is not a directory")
    if run_dir is not None and (why := owned_dir_problem(run_dir)):  # the report is written there
        fail(f"--run-dir: {why}")
    run_dir = run_dir or cfg.run_dir
    before = next_phase(after)
    ids = _parse_gpus(gpus) if gpus is not None else (list(cfg.gpus) if cfg else None)
    ports = sorted(set(ports_for(cfg, after, before) if cfg else []) | set(port))
    stack = contextlib.ExitStack()
    _lease(stack, run_dir, ids or [], wait)
    try:
        report = run_handoff(run_dir, cfg.handoff if cfg else Handoff(), ids, ports,
                             label=f"{after}-to-{before or 'end'}").to_dict()
        code = 0
    except HandoffError as e:
        if e.report is None:
            fail(str(e), code=1)
        report, code = e.report.to_dict(), 1
    except PipelineError as e:
        fail(str(e), code=1)
    finally:
        stack.close()
    if as_json:
        out.print_json(json.dumps(report, default=str))
    else:
        out.print(renderable(report))
    if code:
        err.print(f"[bold red]handoff refused[/]: {escape('; '.join(report['problems']))}", highlight=False,
                  soft_wrap=True)
    raise typer.Exit(code)


@app.command("gpus")
def gpus_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """Show each NVIDIA GPU: v2 memory used/reserved/free, utilisation and the processes on it."""
    from rich.table import Table

    from .handoff.gpus import NvmlBackend, NvmlUnavailable

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
        fail(str(e), code=1)
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

    from .doctor import FAIL, WARN, failed, run_doctor

    cfg = _load(config)
    with contextlib.ExitStack() as stack:
        _lease(stack, cfg.run_dir, [], wait)
        checks = run_doctor(cfg, engines=engines)
    if as_json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        colour = {FAIL: "red", WARN: "yellow"}
        for c in checks:
            fix = f"  [dim]fix: {escape(c.fix)}[/]" if c.fix and c.status != "PASS" else ""
            out.print(f"[{colour.get(c.status, 'green')}]{c.status}[/] {escape(c.name):24s} {escape(c.reason)} "
                      f"[dim]({c.seconds:.1f} s)[/]{fix}", highlight=False, soft_wrap=True)
    raise typer.Exit(1 if failed(checks) else 0)


@app.command("check-drafter")
def check_drafter_cmd(
        directory: Path = typer.Argument(..., help="Drafter checkpoint dir (config.json + model.safetensors)."),
        engine: str = typer.Option(..., "--engine", help="Serving engine whose loader to check against: vllm or sglang."),
        target: Optional[Path] = typer.Option(None, "--target", help="Target model dir: also check vocab, hidden "
                                                                     "size and that the aux layers exist."),
        aux_layer_ids: Optional[list[int]] = typer.Option(
            None, "--aux-layer-ids", help="Layers the drafter's hidden states were extracted from, vllm convention "
                                          "(input of decoder layer k), without the last layer; repeat per id."),
        as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
        ) -> None:
    """Gate a drafter checkpoint for a serving engine: exit 0 pass, 1 fail (each problem says what to fix)."""
    from .checkpoints import check_drafter

    if engine not in ("vllm", "sglang"):
        fail(f"--engine: {engine!r}; choose vllm or sglang")
    report = check_drafter(directory, engine, target=target, expected_aux_ids=list(aux_layer_ids) if aux_layer_ids else None)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        (out if report.ok else err).print(report.render(), highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(0 if report.ok else 1)


@app.command("export-drafter")
def export_drafter_cmd(
        directory: Path = typer.Argument(..., help="Drafter checkpoint dir to read."),
        output: Path = typer.Argument(..., help="Dir to write (replaced if it exists)."),
        engine: str = typer.Option(..., "--engine", help="Layout to write: vllm or sglang."),
        convention: Optional[str] = typer.Option(
            None, "--aux-convention", help="How DIR's stored aux ids are meant: vllm or sglang (default: vllm for a "
                                           "speculators checkpoint, sglang for an EAGLE-layout one)."),
        ) -> None:
    """Rewrite a drafter in an engine's layout (weight names, config format, aux-id convention), then gate it."""
    from .checkpoints import check_drafter
    from .drafter_export import export_drafter

    if engine not in ("vllm", "sglang") or convention not in (None, "vllm", "sglang"):
        fail("--engine and --aux-convention take vllm or sglang")
    _replaceable(output, "OUTPUT")
    try:
        path = export_drafter(directory, output, engine, source_convention=convention)
    except PipelineError as e:
        fail(str(e), code=1)
    report = check_drafter(path, engine)
    (out if report.ok else err).print(report.render(), highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(0 if report.ok else 1)


@app.command("make-test-drafter")
def make_test_drafter(
        directory: Path = typer.Argument(..., help="Drafter directory to write (replaced if built differently)."),
        target: Path = typer.Option(..., "--target", help="Target model dir the drafter is sized for."),
        constant: bool = typer.Option(False, "--constant", help="Full draft vocab and zeroed norm: always drafts "
                                                                "token 0 (100 % acceptance with a --constant target)."),
        seed: int = typer.Option(0, "--seed", help="Weight seed."),
        ) -> None:
    """Write an untrained (random) or constant EAGLE-format EAGLE-3 drafter, to check the benchmark's measurement."""
    from .engines.drafters import DrafterSpec, ensure_drafter
    from .tinymodel import default_engine

    _replaceable(directory, "DIRECTORY")
    try:
        path = ensure_drafter(directory, target, default_engine(), DrafterSpec(constant=constant, seed=seed))
    except ConfigError as e:
        fail(str(e))
    except PipelineError as e:
        fail(str(e), code=1)
    out.print(f"[green]drafter[/]: {escape(str(path))} ({'constant' if constant else 'random, untrained'})")


@app.command()
def status(target: Path = typer.Argument(DEFAULT_CONFIG, help="A pipeline config, or the run dir of a run.",
                                         show_default="configs/tiny-cpu.yaml"),
           as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
           watch: bool = typer.Option(False, "--watch", help="Redraw every --every seconds until the run ends."),
           every: float = typer.Option(2.0, "--every", min=0.2, help="Seconds between redraws with --watch."),
           ) -> None:
    """What a run is doing (from another terminal; no Prefect server needed): phase, progress, ETA,
    services, last handoff, failures, disk; for an ended run its outcome and the command that resumes it."""
    from .status import collect, render, resolve

    try:
        run_dir, config_path = resolve(target)
    except ConfigError as e:
        fail(str(e))
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


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the last line: one message and exit 1, never a traceback
        if os.environ.get("EAGLE3_DEBUG"):
            raise
        log = _crash_log()
        err.print(f"error: unexpected {type(e).__name__}: {echo(str(e), 500, quote=False)}\n(details in {log}; "
                  "EAGLE3_DEBUG=1 shows the traceback here)", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)


def _crash_log() -> str:
    """Write the traceback of the exception being handled to a file; its path, or why not."""
    import tempfile
    import time
    import traceback

    text = traceback.format_exc()[-1_000_000:]
    for folder in (Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "eagle3",
                   Path(tempfile.gettempdir())):
        path = folder / f"eagle3-crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return str(path)
        except OSError:
            continue
    return "nowhere (no writable state or temp directory)"


if __name__ == "__main__":
    main()
