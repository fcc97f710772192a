"""What the `eagle3` commands share: the consoles, the exit-code mapping (`fail_with`), config loading,
the run's leases and its recovery handoff. A command ends on an error only through `fail_with`, whose
exit code is the error class's own (eagle3.errors)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from .. import phase_table
from ..config import DEFAULT_CONFIG, load_config, owned_dir_problem, remote_binds
from ..errors import ConfigError, HandoffError

out = Console()
err = Console(stderr=True)


ConfigArg = typer.Argument(DEFAULT_CONFIG, help="Pipeline config (YAML). Default: the CPU demo on the real SmolLM2-135M-Instruct.",
                           show_default="configs/smollm2-cpu.yaml")


INTERRUPTED = 130  # the shell's code for a command ended by SIGINT (128 + 2), Ctrl-C or the pack's SIGTERM alike


def exit_code(e: BaseException) -> int:
    """The one mapping from an error to the CLI's exit status: each error class carries its own
    (eagle3.errors: 2 bad input, 1 a step that failed, 3 busy); an interrupt 130; anything else is 1."""
    return INTERRUPTED if isinstance(e, KeyboardInterrupt) else int(getattr(e, "exit_code", 1))


def end(failure: BaseException | None) -> NoReturn:
    """A command that printed its own verdict ends here: 0, or the code of the failure's class."""
    raise typer.Exit(0 if failure is None else exit_code(failure))


def fail_with(e: BaseException, message: str | None = None) -> NoReturn:
    """The one way a command ends on an error: its message (or `message`), and its class's exit code."""
    # escape(): messages quote config values, and "[/x]" in one would be a rich markup error
    err.print(f"[bold red]error[/]: {escape(message or str(e))}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(exit_code(e))


def bad_input(message: str) -> NoReturn:
    """A refused argument or option: a ConfigError's exit (the message names it and the fix)."""
    fail_with(ConfigError(message))


def load_cfg(config: Path):
    try:
        cfg = load_config(config)
    except ConfigError as e:
        fail_with(e)
    for line in remote_binds(cfg):  # allowed by the config (allow_remote), said at every use of it
        err.print(f"[bold yellow]warning[/]: {escape(line)}", highlight=False, soft_wrap=True)
    return cfg


WaitOption = typer.Option(0.0, "--wait", min=0, metavar="SECONDS",
                          help="If another run holds this run dir or one of its GPUs, wait up to SECONDS for it "
                               "instead of refusing at once (exit 3).")


def take_lease(stack: contextlib.ExitStack, run_dir: Path, gpus: list[int], wait_s: float) -> None:
    """Take the run dir's lease (and the GPUs') before anything else touches the run dir; a run
    that holds them already is named and nothing is started or stopped (exit 3); a run dir or lock
    dir another user could have written is refused, naming the path, owner, mode and fix (exit 2)."""
    from ..process.lease import LeaseBusy, hold

    try:
        stack.enter_context(hold(run_dir, gpus, wait_s))
    except LeaseBusy as e:
        fail_with(e)
    except ConfigError as e:  # the run dir or the lock dir is not provably the user's (owned.NotOwned)
        fail_with(e)


def recover(cfg, sup, ports: list[int] | None = None) -> None:
    """The run's first handoff: end what a dead earlier run of this run dir left, before the doctor."""
    from ..handoff.core import recovery_handoff
    from ..handoff.view import summary_line
    from ..progress import watched_by
    from ..progress.display import Display

    try:
        report = recovery_handoff(cfg, supervisor=sup, ports=ports)
    except HandoffError as e:
        fail_with(e, summary_line(e.report) if e.report is not None else None)
    if not watched_by(Display):  # a progress display already shows the handoff's line
        err.print(summary_line(report), highlight=False, soft_wrap=True, markup=False)


def check_replaceable(directory: Path, argument: str) -> None:
    """An output directory a command replaces as a whole: never one the pack may not own (/, $HOME,
    its checkout, ...), never a directory of other files."""
    why = owned_dir_problem(directory, purpose="the command replaces it as a whole: give a new directory")
    if why:
        bad_input(f"{argument}: {why}")
    if directory.is_dir() and not (directory / "config.json").is_file() and any(directory.iterdir()):
        bad_input(f"{argument}: {directory} holds other files (and no config.json); the command would replace it as a "
             "whole: give a new or empty directory")


def check_phases(names: list[str], option: str) -> None:
    for name in names:
        try:
            phase_table.check(name, option)
        except ConfigError as e:
            fail_with(e)


def raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def prefect_defaults() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")



