"""`eagle3` command line. Each command is a thin shell over the core; exit 2 means bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .config import DEFAULT_CONFIG, PHASES, load_config
from .errors import ConfigError, PipelineError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Run the EAGLE-3 drafter pipeline (data generation -> hidden states -> training -> "
                       "speculative-decode benchmark) with a proven GPU handoff between phases.")
out = Console()
err = Console(stderr=True)

ConfigArg = typer.Argument(DEFAULT_CONFIG, help="Pipeline config (YAML). Default: the tiny CPU rehearsal.",
                           show_default="configs/tiny-cpu.yaml")


def fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error[/]: {message}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _load(config: Path):
    try:
        return load_config(config)
    except ConfigError as e:
        fail(str(e))


@app.command()
def validate(config: Path = ConfigArg) -> None:
    """Validate a config completely; exit 0 if valid, 2 with every problem listed."""
    cfg = _load(config)
    out.print(f"[green]valid[/]: {config} (pipeline '{cfg.name}', run dir {cfg.run_dir}, "
              f"{'CPU rehearsal' if cfg.cpu_rehearsal else f'GPUs {cfg.gpus}'})")


def _check_phases(names: list[str], option: str) -> None:
    for name in names:
        if name not in PHASES:
            fail(f"{option}: unknown phase {name!r}; choose from {', '.join(PHASES)}")


@app.command()
def run(config: Path = ConfigArg,
        only: Optional[str] = typer.Option(None, "--only", help=f"Run just this phase ({', '.join(PHASES)})."),
        from_: Optional[str] = typer.Option(None, "--from", help="Start at this phase; earlier ones must be done."),
        force: list[str] = typer.Option([], "--force", help="Redo this phase even if done (repeatable)."),
        ) -> None:
    """Run the pipeline flow (phases with a GPU handoff between each two)."""
    _check_phases([p for p in (only, from_) if p] + list(force), "--only/--from/--force")
    if only and from_:
        fail("--only and --from cannot be combined; pick one")
    cfg = _load(config)
    from .runner import run_pipeline  # imported late: pulls in Prefect

    try:
        code = run_pipeline(config, cfg, only=only, from_=from_, force=list(force))
    except PipelineError as e:
        fail(str(e), code=1)
    raise typer.Exit(code)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
