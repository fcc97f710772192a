"""Phase 3 without an accelerator: resume bookkeeping on real checkpoint layouts, the trainer's
command line, and the dry-run decision. (The trainer itself runs in test_train_serve.py on CPU
with --dry-run and in tests/gpu/test_train_gpu.py for real.)

Checkpoint dirs here have the files `speculators train` writes; the scheduler state is a real
torch.save of transformers' linear-warmup LambdaLR (what the trainer uses) after 37 optimizer steps.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from eagle3.errors import ConfigError
from eagle3.engines.sglang import ENGINE as SGLANG
from eagle3.phases.train import build_argv, trainer_gpus, use_dry_run
from eagle3.phases.torch_pickle import TorchFileError, load_plain
from eagle3.phases.train_resume import (checkpoint_freq_allows_resume, finished_checkpoint, prepare_resume, scheduler_step)
from tests.test_checkpoints import make_ckpt

RESUME = Path(__file__).resolve().parents[1] / "fixtures" / "eagle3-tiny" / "resume"
SCHED37 = RESUME / "scheduler_state_dict_step37.pt"


def epoch_dir(save: Path, name: str, state: dict | None, sched: Path | None = SCHED37) -> Path:
    d = make_ckpt(save / name)
    shutil.copy2(RESUME / "optimizer_state_dict.pt", d / "optimizer_state_dict.pt")
    if sched is not None:
        shutil.copy2(sched, d / "scheduler_state_dict.pt")
    if state is not None:
        (d / "training_state.json").write_text(json.dumps(state))
    return d


def state(epoch, local, glob):
    return {"epoch": epoch, "local_step": local, "global_step": glob}


# ---- reading torch files without torch --------------------------------------------------------

def test_scheduler_step_read_without_torch():
    assert load_plain(SCHED37)["last_epoch"] == 37
    assert scheduler_step(SCHED37.parent / "missing") is None


def test_torch_pickle_refuses_foreign_classes(tmp_path):
    import pickle
    import zipfile

    evil = tmp_path / "evil.pt"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(shutil.rmtree, protocol=2))
    with pytest.raises(TorchFileError, match="refusing to load shutil.rmtree"):
        load_plain(evil)


# ---- interrupted/ ----------------------------------------------------------------------------------

def test_interrupted_mid_epoch_is_renamed_to_its_epoch_with_the_step(tmp_path):
    """Epoch 0 ended at global step 29; the interrupt save holds step 37, i.e. step 8 of epoch 1.
    speculators would ignore interrupted/ and redo epoch 1 from its start; after this it resumes
    epoch 1 at step 8."""
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 29))
    epoch_dir(save, "interrupted", None)
    plan = prepare_resume(save)
    assert not (save / "interrupted").exists()
    assert json.loads((save / "1" / "training_state.json").read_text())["local_step"] == 8
    assert json.loads((save / "1" / "training_state.json").read_text())["global_step"] == 37
    assert plan.latest.epoch == 1 and plan.latest.local_step == 8
    assert "renamed interrupted/ to 1/" in plan.actions[0]
    assert finished_checkpoint(save, 2) is None  # epoch 1 is not finished


def test_interrupted_in_first_epoch(tmp_path):
    save = tmp_path / "ckpt"
    epoch_dir(save, "interrupted", None)
    plan = prepare_resume(save)
    assert plan.latest.epoch == 0 and plan.latest.local_step == 37 and plan.latest.global_step == 37


def test_interrupted_supersedes_an_older_mid_epoch_checkpoint(tmp_path):
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 20))
    epoch_dir(save, "1", state(1, 10, 30))   # sub-epoch checkpoint at step 10 of epoch 1
    epoch_dir(save, "interrupted", None)      # step 37 = step 17 of epoch 1
    plan = prepare_resume(save)
    assert json.loads((save / "1" / "training_state.json").read_text())["local_step"] == 17
    set_aside = list((save / ".set-aside").iterdir())
    assert len(set_aside) == 1 and set_aside[0].name.startswith("1-")
    assert plan.latest.global_step == 37


def test_interrupted_during_validation_is_not_newer(tmp_path):
    """Stopped after epoch 1 was saved (during validation): nothing new in interrupted/."""
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 20))
    epoch_dir(save, "1", state(1, 0, 37))
    epoch_dir(save, "interrupted", None)
    plan = prepare_resume(save)
    assert not (save / "interrupted").exists() and plan.latest.epoch == 1 and plan.latest.end_of_epoch
    assert "not newer" in plan.actions[0]


def test_interrupted_without_step_is_set_aside(tmp_path):
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 29))
    epoch_dir(save, "interrupted", None, sched=None)  # scheduler_type none: no scheduler file
    plan = prepare_resume(save)
    assert plan.latest.epoch == 0 and "cannot be determined" in plan.actions[0]
    assert not (save / "1").exists()


def test_unfinished_interrupt_save_is_set_aside(tmp_path):
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 29))
    inter = epoch_dir(save, "interrupted", None)
    (inter / "optimizer_state_dict.pt").unlink()  # the save was cut short
    plan = prepare_resume(save)
    assert "did not finish" in plan.actions[0] and plan.latest.epoch == 0


def test_epoch_cut_short_by_a_hard_kill_is_set_aside(tmp_path):
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 29))
    cut = epoch_dir(save, "1", None)  # no training_state.json: the trainer writes it last
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[:100])
    plan = prepare_resume(save)
    assert not (save / "1").exists() and plan.latest.epoch == 0 and "incomplete" in plan.actions[0]


def test_finished_training_is_recognised(tmp_path):
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 29))
    epoch_dir(save, "1", state(1, 0, 58))
    assert finished_checkpoint(save, 2).global_step == 58
    assert finished_checkpoint(save, 3) is None


@pytest.mark.parametrize("args,ok", [([], True), (["--checkpoint-freq", "0.5"], True),
                                     (["--checkpoint-freq=2"], False), (["--checkpoint-freq", "x"], False)])
def test_checkpoint_freq(args, ok):
    assert checkpoint_freq_allows_resume(args) is ok


# ---- mode and command line ---------------------------------------------------------------------

def test_dry_run_decision(make_config):
    assert use_dry_run(make_config(check_files=False)) is True                       # auto, no GPUs
    assert use_dry_run(make_config({"gpus": [0]}, check_files=False)) is False       # auto, GPUs
    assert use_dry_run(make_config({"gpus": [0], "train": {"dry_run": "always"}}, check_files=False)) is True
    with pytest.raises(ConfigError, match="train.dry_run: 'never' needs GPUs"):
        use_dry_run(make_config({"train": {"dry_run": "never"}}, check_files=False))


class _Manifest:  # the fields of ExtractManifest that training reads
    prepared_data = "/data/prepared"
    hidden_states_dir = "/data/hs"
    target_layer_ids = [2, 4, 5]
    dtype = "bfloat16"
    mode = "offline"


class _OnlineManifest(_Manifest):
    hidden_states_dir = "/run/train/hs-cache"
    mode = "online"


def test_trainer_argv(make_config, tmp_path):
    cfg = make_config({"gpus": [0], "train": {"epochs": 4, "lr": 3e-4, "total_seq_len": 2048, "draft_vocab_size": 1024,
                                             "extra_args": ["--optimizer", "adamw"]}}, check_files=False)
    argv = build_argv(cfg, _Manifest(), tmp_path / "save", dry_run=False)
    assert argv[0].endswith("/speculators") and argv[1] == "train"
    joined = " ".join(argv)
    for part in ("--target-layer-ids 2 4 5", "--epochs 4", "--lr 0.0003", "--total-seq-len 2048",
                 "--draft-vocab-size 1024", "--data-path /data/prepared", "--hidden-states-path /data/hs",
                 "--on-missing raise", "--hidden-states-dtype bfloat16", "--ttt-steps 3"):
        assert part in joined, part
    assert "--dry-run" not in argv and argv[-2:] == ["--optimizer", "adamw"]  # pass-through last: it wins


def test_online_trainer_argv_asks_the_co_scheduled_server_and_uses_only_its_gpu_set(make_config, tmp_path):
    cfg = make_config({"gpus": [0, 1, 2, 3], "hidden_states": {"mode": "online", "server_gpus": [0, 1],
                                                               "train_gpus": [2, 3]}}, check_files=False)
    argv = build_argv(cfg, _OnlineManifest(), tmp_path / "save", dry_run=False)
    joined = " ".join(argv)
    assert "--nproc-per-node 2" in joined  # the trainer's set, not all of gpus
    assert f"--on-missing generate --vllm-endpoint http://127.0.0.1:{cfg.extract.server.port}/v1" in joined
    assert "--hidden-states-path /run/train/hs-cache" in joined and "--on-missing raise" not in joined
    assert trainer_gpus(cfg, _OnlineManifest()) == [2, 3] and trainer_gpus(cfg, _Manifest()) == [0, 1, 2, 3]


def test_trainer_argv_multi_gpu_and_sglang(make_config, tmp_path):
    cfg = make_config({"gpus": [0, 1, 2, 3], "bench": {"engine": "sglang"},
                       "engines": {"sglang": {"python": "/opt/sglang/bin/python"}}}, check_files=False)
    argv = build_argv(cfg, _Manifest(), tmp_path / "save", dry_run=False)
    assert argv[0].endswith("/torchrun") and argv[1:7] == ["--standalone", "--nnodes", "1", "--nproc-per-node", "4", "-m"]
    assert argv[7] == "speculators.train"
    assert all(flag in argv for flag in SGLANG.drafter_train_flags)
    dry = build_argv(cfg, _Manifest(), tmp_path / "save", dry_run=True)
    assert dry[1] == "train" and "--dry-run" in dry  # a dry run is one process


def test_real_interrupt_save_from_the_gpu_run(tmp_path):
    """The scheduler state of the interrupt save that tests/gpu/test_train_gpu.py made on an H200
    (SIGTERM during epoch 3, global step 179; epoch 2 had ended at global step 158). The phase
    renamed it to 3/ with local_step 21 and speculators logged "Resuming mid-epoch from epoch=3
    local_step=21 global_step=179", then "Fast-skipping 21 batches"; the run ended at global step
    1057, the same as an uninterrupted run of the same config."""
    real = RESUME / "interrupted_scheduler_state_dict_step179.pt"
    assert scheduler_step(real.parent / "x") is None and load_plain(real)["last_epoch"] == 179
    save = tmp_path / "ckpt"
    epoch_dir(save, "0", state(0, 0, 53))
    epoch_dir(save, "1", state(1, 0, 105))
    epoch_dir(save, "2", state(2, 0, 158))
    epoch_dir(save, "interrupted", None, sched=real)
    plan = prepare_resume(save)
    assert plan.latest.epoch == 3 and plan.latest.local_step == 21 and plan.latest.global_step == 179
