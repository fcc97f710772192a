"""The real train phase (eagle3.phases.train.run_train), swapped in through EAGLE3_PHASE_TABLE
with one change: the dry-run decision is forced off. This machine has no accelerator, so on a CPU
config the phase would only dry-run; with the stand-in trainer (standin_engine.py) in the engine
venv, the launch, stop grace, interrupt checkpoint and resume paths are the ones a GPU run takes."""

from __future__ import annotations

from eagle3.phase_table import with_runs
from eagle3.phases import train as phase


def train(cfg, sup):
    phase.use_dry_run = lambda cfg: False
    return phase.run_train(cfg, sup)


TABLE = with_runs({"train": "real_train_phase:train"})
