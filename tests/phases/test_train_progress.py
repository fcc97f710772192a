"""Training progress read from the trainer's log: epochs from its epoch lines, step and loss from
its metric lines (wrapped by rich over several lines), while the log grows."""

from __future__ import annotations

import textwrap
import time

import pytest

from eagle3.phases.train_log import LogFollower, TrainerProgress, follow_training
from eagle3.process.services import LaunchSpec, Supervisor
from tests.conftest import ENGINE_PYTHON, requires_engine

# What speculators 0.9's rich handler wrote at COLUMNS=240 (see the engine test below, which makes it for real).
LOG = """\
[18:49:47] INFO     Training epoch 1/2 started                                                       <string>:7
           INFO     train/loss=2.314, train/loss_0=2.100, train/full_acc_0=0.012, train/cond_acc_0=0.500,   <string>:8
                    train/cond_acc_2=0.100, profile/tokens_per_s=1.23e+04, epoch=0,
                    lr=1.00e-04, global_step=7
           INFO     Training epoch 1/2 completed                                                     <string>:9
           INFO     val/loss_epoch=2.200, val/full_acc_0_epoch=0.020, epoch=0                        <string>:10
"""


def test_epochs_step_and_loss_from_wrapped_lines():
    p = TrainerProgress(epochs=2)
    changed = [p.feed(line) for line in LOG.splitlines()]
    assert (p.epoch, p.completed, p.step, p.loss) == (1, 1, 7, pytest.approx(2.314))
    assert changed == [True, True, False, True, True, False]  # val/loss_epoch and epoch=0 are not the train loss
    assert p.detail() == {"epoch": 1, "epochs": 2, "step": 7, "loss": pytest.approx(2.314)}


def test_a_resumed_run_counts_the_epochs_before_it():
    p = TrainerProgress(epochs=4)
    p.feed("[10:00:00] INFO     Training epoch 3/4 started")
    assert (p.epoch, p.completed, p.epochs) == (3, 2, 4)


def test_follower_reads_only_what_is_appended_and_waits_for_whole_lines(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("Training epoch 1/9 started (an earlier launch)\n")
    reported = []
    with follow_training(log, 2, lambda done, total, **d: reported.append((done, total, d))) as follower:
        with open(log, "a") as fh:
            fh.write("==> eagle3: launching train\nTraining epoch 1/2 started\n  train/loss=3.5, glob")
        follower.read()
        assert reported == [(0, 2, {"epoch": 1, "epochs": 2})]
        with open(log, "a") as fh:
            fh.write("al_step=12\nTraining epoch 1/2 completed\n")
    assert reported[-1] == (1, 2, {"epoch": 1, "epochs": 2, "step": 12, "loss": 3.5})


def test_follower_thread_picks_up_lines_within_a_second(tmp_path):
    log = tmp_path / "train.log"
    lines = []
    with LogFollower(log, lines.append, every_s=0.1):
        log.write_text("one\ntwo\n")
        deadline = time.monotonic() + 5
        while len(lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lines == ["one", "two"]


@requires_engine
@pytest.mark.engine
def test_the_real_trainer_logger_output_parses(tmp_path):
    """speculators' own logging setup (rich handler, dict formatter) produces what is parsed."""
    code = textwrap.dedent("""
        import logging
        from speculators.train.logger import setup_root_logger
        setup_root_logger()
        root, metric = logging.getLogger("speculators"), logging.getLogger("speculators.metrics")
        root.info("Training epoch 2/3 started")
        metric.info({"train": {f"{k}_{i}": 0.5 for k in ("loss", "full_acc", "cond_acc") for i in range(3)}
                     | {"loss": 1.875}, "profile": {"fwd_ms": 40.1, "bwd_ms": 80.3, "tokens_per_s": 12345.6},
                     "epoch": 1, "lr": 1e-4, "global_step": 41}, extra={"step": 41})
        root.info("Training epoch 2/3 completed")
    """)
    log = tmp_path / "train.log"
    sup = Supervisor(tmp_path / "state")
    p = TrainerProgress(epochs=3)
    with LogFollower(log, p.feed, every_s=0.2):
        sup.run(LaunchSpec(name="logger", argv=[str(ENGINE_PYTHON), "-c", code], log=log, env={"COLUMNS": "240"}),
                timeout_s=120)
    assert (p.epoch, p.completed, p.step, p.loss) == (2, 2, 41, pytest.approx(1.875))
