"""The `eagle3` app: the fixed commands register on it (run, observe, tools), and the phase table's
rows add one command each (phases.PhaseCommands)."""

from __future__ import annotations

import typer

from .phases import PhaseCommands

app = typer.Typer(cls=PhaseCommands, add_completion=False, no_args_is_help=True,
                  help="Run the EAGLE-3 drafter pipeline (data generation -> hidden states -> training -> "
                       "speculative-decode benchmark) with a proven GPU handoff between phases.")
