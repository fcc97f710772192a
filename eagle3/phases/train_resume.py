"""Make `speculators train`'s own resume pick up the right checkpoint (docs/FACTS.md §1).

The trainer resumes from the highest integer epoch dir under its save path, mid-epoch when that
dir's training_state.json says so. Two cases it gets wrong on its own, handled here before it starts:

* A dir cut short by a hard kill (no training_state.json, which the trainer writes last, or an
  unreadable model file) would be loaded as if complete: it is moved aside, so the trainer
  resumes from the one before.
* On SIGTERM/SIGINT it saves `interrupted/` (weights, optimizer, scheduler; no training_state.json)
  and its resume ignores that dir. Here it is renamed to the epoch it was interrupted in, with a
  training_state.json giving the step it reached, so the trainer continues that epoch from that
  step. The step count comes from the scheduler state saved with it (LR schedulers step once per
  optimizer step, so `last_epoch` is the global step); the epoch and the step within it follow from
  the global step recorded in the latest complete checkpoint. If the step cannot be known
  (scheduler_type none, --checkpoint-freq > 1, an unreadable file) or the interrupted save holds
  nothing newer, it is moved aside instead and training resumes from the last complete checkpoint.

Nothing is deleted: set-aside dirs go to <save_path>/.set-aside/, which the trainer ignores.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..fsio import atomic_write_json, fsync_dir, read_json
from ..safetensors_header import SafetensorsError, read_header
from .torch_pickle import TorchFileError, load_plain

INTERRUPTED = "interrupted"
SET_ASIDE = ".set-aside"
MODEL = "model.safetensors"
OPTIMIZER = "optimizer_state_dict.pt"
SCHEDULER = "scheduler_state_dict.pt"
STATE = "training_state.json"


@dataclass
class EpochCheckpoint:
    epoch: int
    path: Path
    local_step: int   # 0: end of epoch
    global_step: int

    @property
    def end_of_epoch(self) -> bool:
        return self.local_step == 0


@dataclass
class ResumePlan:
    latest: EpochCheckpoint | None = None           # what the trainer will resume from
    actions: list[str] = field(default_factory=list)  # human-readable record of what was changed

    def to_dict(self) -> dict:
        latest = None if self.latest is None else {
            "epoch": self.latest.epoch, "path": str(self.latest.path), "local_step": self.latest.local_step,
            "global_step": self.latest.global_step}
        return {"resume_from": latest, "actions": list(self.actions)}


def _model_ok(path: Path) -> bool:
    try:
        read_header(path / MODEL)
        return True
    except SafetensorsError:
        return False


def _epoch_dirs(save_path: Path) -> list[Path]:
    out = []
    for d in save_path.iterdir() if save_path.is_dir() else []:
        if d.is_dir() and not d.is_symlink() and d.name.isdigit():
            out.append(d)
    return sorted(out, key=lambda d: int(d.name))


def read_epoch(path: Path) -> EpochCheckpoint | None:
    """A complete epoch checkpoint, or None if the dir was cut short."""
    state = read_json(path / STATE, default=None) if (path / STATE).is_file() else None
    if not isinstance(state, dict) or not (path / OPTIMIZER).is_file() or not _model_ok(path):
        return None
    try:
        return EpochCheckpoint(int(path.name), path, int(state.get("local_step", 0)), int(state.get("global_step", 0)))
    except (TypeError, ValueError):
        return None


def scheduler_step(path: Path) -> int | None:
    """Global optimizer step of a checkpoint, from its LR scheduler state (None if unknown)."""
    try:
        data = load_plain(path / SCHEDULER)
    except (TorchFileError, FileNotFoundError):
        return None
    states = data if isinstance(data, list) else [data]
    steps = {s.get("last_epoch") for s in states if isinstance(s, dict)}
    steps.discard(None)
    return int(steps.pop()) if len(steps) == 1 else None


def _set_aside(save_path: Path, path: Path, why: str, plan: ResumePlan) -> None:
    dest = save_path / SET_ASIDE / f"{path.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(path, dest)
    fsync_dir(save_path)
    plan.actions.append(f"moved {path.name}/ to {dest.relative_to(save_path)} ({why})")


def latest_complete(save_path: Path) -> EpochCheckpoint | None:
    found = [c for c in (read_epoch(d) for d in _epoch_dirs(save_path)) if c is not None]
    return found[-1] if found else None


def prepare_resume(save_path: Path | str, step_known: bool = True) -> ResumePlan:
    """Fix up `save_path` so the trainer resumes from the newest usable state. `step_known=False`
    (e.g. --checkpoint-freq > 1, where an epoch may end unsaved) sets interrupted/ aside instead."""
    save_path = Path(save_path)
    plan = ResumePlan()
    if not save_path.is_dir():
        return plan
    # 1. Epoch dirs cut short by a hard kill, newest first (only a trailing one can be partial,
    #    but a partial dir below a complete one is set aside as well rather than trusted).
    for d in reversed(_epoch_dirs(save_path)):
        if read_epoch(d) is None:
            _set_aside(save_path, d, "incomplete: no training_state.json or unreadable model", plan)
    latest = latest_complete(save_path)
    # 2. interrupted/
    inter = save_path / INTERRUPTED
    if inter.is_dir():
        _adopt_interrupted(save_path, inter, latest, step_known, plan)
        latest = latest_complete(save_path)
    plan.latest = latest
    return plan


def _adopt_interrupted(save_path: Path, inter: Path, latest: EpochCheckpoint | None, step_known: bool,
                       plan: ResumePlan) -> None:
    if not ((inter / OPTIMIZER).is_file() and _model_ok(inter)):
        _set_aside(save_path, inter, "the interrupt save did not finish", plan)
        return
    g = scheduler_step(inter) if step_known else None
    if g is None:
        _set_aside(save_path, inter, "its training step cannot be determined; resuming from the last complete "
                   "checkpoint", plan)
        return
    if latest is None:
        epoch, epoch_start = 0, 0
    elif latest.end_of_epoch:
        epoch, epoch_start = latest.epoch + 1, latest.global_step
    else:
        epoch, epoch_start = latest.epoch, latest.global_step - latest.local_step
    local = g - epoch_start
    newest = latest.global_step if latest else 0
    if g <= newest or local <= 0:
        _set_aside(save_path, inter, f"holds step {g}, not newer than the checkpoint at step {newest}", plan)
        return
    target = save_path / str(epoch)
    if target.exists():  # a mid-epoch checkpoint of the same epoch, older than the interrupt save
        _set_aside(save_path, target, f"superseded by interrupted/ (step {g})", plan)
    atomic_write_json(inter / STATE, {"epoch": epoch, "local_step": local, "global_step": g,
                                      "adopted_from": INTERRUPTED})
    os.rename(inter, target)
    fsync_dir(save_path)
    plan.actions.append(f"renamed interrupted/ to {epoch}/ (epoch {epoch}, step {local} of it, global step {g}) "
                        "so the trainer resumes there")


def finished_checkpoint(save_path: Path | str, epochs: int) -> EpochCheckpoint | None:
    """The end-of-training checkpoint (last epoch, end of epoch) if training is complete."""
    c = read_epoch(Path(save_path) / str(epochs - 1))
    return c if c is not None and c.end_of_epoch else None


def checkpoint_freq_allows_resume(extra_args: list[str]) -> bool:
    """With --checkpoint-freq > 1 some epochs end unsaved, so an interrupt's epoch cannot be derived."""
    for i, arg in enumerate(extra_args):
        value = arg.split("=", 1)[1] if arg.startswith("--checkpoint-freq=") else (
            extra_args[i + 1] if arg == "--checkpoint-freq" and i + 1 < len(extra_args) else None)
        if value is not None:
            try:
                return float(value) <= 1
            except ValueError:
                return False
    return True


def describe(save_path: Path) -> str:
    c = latest_complete(Path(save_path))
    if c is None:
        return "no complete checkpoint"
    where = "end" if c.end_of_epoch else f"step {c.local_step}"
    return f"epoch {c.epoch} ({where}), global step {c.global_step}"

