"""`eagle3 <phase>`: one command per row of the phase table, each through eagle3.phase_runner.run_phase."""

from __future__ import annotations

import contextlib
import inspect
import signal
from pathlib import Path
from typing import Optional

import click
import typer
from rich.markup import escape
from typer.core import TyperGroup

from .. import phase_table
from ..errors import ConfigError, PipelineError
from .common import ConfigArg, WaitOption, end, err, fail_with, load_cfg, out, raise_interrupt, recover, take_lease


@contextlib.contextmanager
def _phase_command(cfg, config: Path, sup, row: phase_table.Phase, wait_s: float, own_server: bool):
    """What every single-phase command shares: the run's leases, then the recovery handoff (for this
    phase's ports; none when the phase uses someone else's server), SIGTERM unwinding like Ctrl-C,
    errors mapped to exit codes (2 bad input, 1 failure, 3 busy, 130 interrupted) with what a rerun
    keeps, and the services the phase started ended. Recorded for `eagle3 status` (run.json,
    progress.json) like a pipeline run. The phase itself runs through eagle3.phase_runner.run_phase
    (its lock, upstream check and markers), as in a pipeline run."""
    from ..errors import GateError
    from ..progress.display import progress_display
    from ..run.record import recording

    signal.signal(signal.SIGTERM, raise_interrupt)
    with contextlib.ExitStack() as stack:
        take_lease(stack, cfg.run_dir, list(cfg.gpus), wait_s)
        # The same display as `eagle3 run`: live on a terminal; off one (a file, a scheduler's log) a
        # line per step and a heartbeat whenever nothing was printed for the interval.
        stack.enter_context(progress_display(start=f"{row.name} alone (`eagle3 {row.name}`)"))
        try:
            with recording(cfg, str(config.resolve()), [row.name]):
                recover(cfg, sup, cfg.phase_ports(row.name) if own_server else [])
                yield
        except KeyboardInterrupt as e:
            err.print(f"interrupted: {row.keeps}")
            end(e)
        except ConfigError as e:
            fail_with(e)
        except GateError as e:
            print_report(cfg, row)
            fail_with(e)
        except PipelineError as e:
            fail_with(e, f"{e}\n(retryable: {e.retryable}; {row.keeps})")
        finally:
            sup.stop_all()


def _run_one_phase(row: phase_table.Phase, config: Path, force: bool, wait: float, options: dict) -> None:
    import logging

    cfg = load_cfg(config)
    from ..phase_runner import run_phase, supervisor

    given = {k: v for k, v in options.items() if v is not None}
    foreign = any(o.foreign_server for o in row.options if o.keyword in given)
    phase_log = logging.getLogger(f"eagle3.{row.name}")  # what the phase reports (kept/redone files, leftovers)
    phase_log.setLevel(logging.INFO)
    phase_log.addHandler(logging.StreamHandler())
    sup = supervisor(cfg)
    with _phase_command(cfg, config, sup, row, wait, own_server=not foreign):
        marker = run_phase(cfg, row.name, sup, force=force, options=given)
    out.print(f"[green]{row.name}[/]: {escape(marker.headline)}", highlight=False, soft_wrap=True)
    print_report(cfg, row)


def print_report(cfg, row: phase_table.Phase) -> None:
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


class PhaseCommands(TyperGroup):
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
