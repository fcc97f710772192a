"""Training progress, read from the trainer's own log while it runs.

speculators train (0.9) logs through rich into logs/train.log (COLUMNS=240):
  "Training epoch 2/5 started" / "Training epoch 2/5 completed"   (1-based, from trainer.run_training)
  "train/loss=2.310, train/loss_0=..., ..., epoch=1, lr=1.00e-04, global_step=120"
                                                 (the metric logger, once per log_freq steps)
A long metric line is wrapped by rich over several lines, so each value is matched on its own and
the last one seen wins. A dry run (no accelerator) logs none of these: it only saves a checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..ticker import Ticker

EPOCH_LINE = re.compile(r"Training epoch (\d+)/(\d+) (started|completed)")
LOSS = re.compile(r"(?<![\w/])train/loss=([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))")
GLOBAL_STEP = re.compile(r"(?<![\w/])global_step=(\d+)")
VAL_FULL_ACC = re.compile(r"(?<![\w/])val/full_acc_(\d+)_epoch=([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)")


@dataclass
class TrainerProgress:
    epochs: int
    epoch: int | None = None   # 1-based: the epoch running, or the last one completed
    completed: int = 0         # epochs finished (a resumed run starts past the earlier ones)
    step: int | None = None    # global step of the last metric line
    loss: float | None = None  # train/loss of the last metric line

    def feed(self, line: str) -> bool:
        """Fold one log line in; True when anything shown changed."""
        before = (self.epoch, self.completed, self.step, self.loss)
        if m := EPOCH_LINE.search(line):
            n, total, what = int(m.group(1)), int(m.group(2)), m.group(3)
            self.epochs, self.epoch = total, n
            self.completed = max(self.completed, n if what == "completed" else n - 1)
        if m := LOSS.search(line):
            self.loss = float(m.group(1))
        if m := GLOBAL_STEP.search(line):
            self.step = int(m.group(1))
        return before != (self.epoch, self.completed, self.step, self.loss)

    def detail(self) -> dict:
        d = {"epoch": self.epoch, "epochs": self.epochs, "step": self.step, "loss": self.loss}
        return {k: v for k, v in d.items() if v is not None}


def validation_full_acc(log: Path) -> list[float] | None:
    """The last epoch's per-position validation accuracy (speculators' val/full_acc_<i>_epoch), as
    the trainer logged it: what the drafter does on held-back training data, which the benchmark's
    serve-parity gate expects back when the drafter is served. None if the log has none (dry run)."""
    epochs = validation_by_epoch(log)
    return epochs[-1] if epochs else None


def validation_by_epoch(log: Path) -> list[list[float]]:
    """Each validation's per-position accuracy, in the order logged (one a completed epoch): what each
    epoch bought (bench/epoch_lever.py). A validation whose positions are not 0..n-1 is left out."""
    try:
        text = Path(log).read_text(errors="replace")
    except OSError:
        return []
    runs: list[dict[int, float]] = []
    for m in VAL_FULL_ACC.finditer(text):
        i = int(m.group(1))
        if i == 0 or not runs or i in runs[-1]:
            runs.append({})
        runs[-1][i] = float(m.group(2))
    return [[r[i] for i in range(len(r))] for r in runs if r and sorted(r) == list(range(len(r)))]


class LogFollower(Ticker):
    """Calls on_line for every complete line appended to `path` from now on (a read per
    `every_s` on a thread; the log is appended to across launches, so what is there is skipped)."""

    def __init__(self, path: Path, on_line: Callable[[str], None], every_s: float = 1.0):
        super().__init__(every_s, name="train-log")
        self.path, self.on_line = Path(path), on_line
        self._offset = self.path.stat().st_size if self.path.exists() else 0
        self._partial = b""

    def read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
                self._offset = fh.tell()
        except FileNotFoundError:
            return
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            self.on_line(line.decode(errors="replace"))

    tick = read


def follow_training(log: Path, epochs: int, report: Callable[..., None]) -> LogFollower:
    """A LogFollower that reports (epochs completed, epochs, epoch/step/loss) whenever they change."""
    state = TrainerProgress(epochs)

    def on_line(line: str) -> None:
        if state.feed(line):
            report(state.completed, state.epochs, **state.detail())

    return LogFollower(log, on_line)
