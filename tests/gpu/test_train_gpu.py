"""Phase 3 for real, on an NVIDIA GPU: `speculators train` under the phase, stopped mid-run, resumed,
gated. Needs a phase-2 output of the fixture target (tests/fixtures/eagle3-tiny/target), made on
any machine with the CPU path and carried over, because the GPU machine has no vLLM:

    eagle3 datagen CFG && eagle3 extract CFG        # CFG: tiny-cpu.yaml with target.model = the fixture
    cp -r RUN_DIR/extract .carry/phase2             # manifest.json, prepared/, hidden_states/

and an interpreter with torch + speculators (EAGLE3_GPU_ENGINE_PYTHON, default: this one; on the
device image: its python3 with the carried wheels on PYTHONPATH). EAGLE3_GPU_OUT, when set, gets
the trained checkpoint and logs (that is how tests/fixtures/eagle3-tiny/drafter-trained was made).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "tests" / "fixtures" / "eagle3-tiny" / "target"
PHASE2 = os.environ.get("EAGLE3_GPU_PHASE2", str(REPO / ".carry" / "phase2"))
ENGINE_PYTHON = os.environ.get("EAGLE3_GPU_ENGINE_PYTHON", sys.executable)
OUT = os.environ.get("EAGLE3_GPU_OUT")
EPOCHS = 20

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.engine,
              pytest.mark.skipif(not (shutil.which("nvidia-smi") or os.environ.get("EAGLE3_GPU_FORCE")),
                                 reason="needs an NVIDIA GPU"),
              pytest.mark.skipif(not (Path(PHASE2) / "manifest.json").is_file(),
                                 reason=f"no phase-2 output at {PHASE2} (see the module docstring)")]


def _engine_bin(tmp: Path) -> Path:
    """A bin dir whose `speculators` runs the speculators CLI with ENGINE_PYTHON (a pip --target
    install has no console script beside the interpreter)."""
    bindir = tmp / "engine" / "bin"
    bindir.mkdir(parents=True)
    script = bindir / "speculators"
    # The guard: data-loader workers are spawned, and re-import this script as their __main__.
    script.write_text(f"#!{ENGINE_PYTHON}\nimport sys\nfrom speculators.__main__ import app\n"
                      "if __name__ == '__main__':\n    sys.exit(app())\n")
    script.chmod(0o755)
    python = bindir / "python"  # a wrapper, not a symlink: a venv interpreter must be run by its own path
    python.write_text(f"#!/bin/sh\nexec {ENGINE_PYTHON} \"$@\"\n")
    python.chmod(0o755)
    return python


def _config(tmp: Path):
    from eagle3.config import load_config

    python = _engine_bin(tmp)
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    server = {"port": 18790, "extra_args": []}
    raw = {
        "name": "gpu-train", "run_dir": str(tmp / "run"), "gpus": [0],
        "target": {"model": str(TARGET), "served_name": "tiny-llama", "dtype": "float32", "max_model_len": 1024},
        "engines": {"vllm": {"python": str(python), "env": env}, "speculators": {"python": str(python), "env": env}},
        "datagen": {"prompts": str(REPO / "configs" / "prompts" / "tiny-prompts.jsonl"), "server": server},
        "extract": {"server": {**server, "port": 18791}, "seq_length": 512},
        "train": {"epochs": EPOCHS, "lr": 3e-3, "total_seq_len": 256, "draft_vocab_size": 2048,
                  "num_speculative_tokens": 3, "dry_run": "never", "stop_grace_s": 120,
                  "loss_implementation": "eager", "draft_attn_impl": "sdpa",
                  "extra_args": ["--num-workers", "0", "--optimizer", "adamw"]},
        "bench": {"server": {**server, "port": 18792}},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _install_phase2(cfg) -> None:
    """Copy the carried phase-2 output into this run dir and point its manifest at the copies."""
    dst = cfg.phase_dir("extract")
    shutil.copytree(PHASE2, dst, ignore=shutil.ignore_patterns("logs"))
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest.update(prepared_data=str(dst / "prepared"), hidden_states_dir=str(dst / "hidden_states"),
                    token_freq=str(dst / "prepared" / "token_freq.pt"), target_model=str(TARGET))
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))


def train_and_stop_mid_epoch(cfg, after: tuple[str, str], deadline_s: float = 300, poll_s: float = 0.01) -> str:
    """Run the train phase on a thread; once the epochs `after` are saved (their gap is an epoch's
    length), stop the trainer through the supervisor (SIGTERM to its group, grace period for the
    interrupt save) about 40 % into the next epoch. Asserts the phase then reports TrainingStopped
    with the interrupt save on disk; returns when it was stopped, in words."""
    from eagle3.phases.train import TrainingStopped, run_train
    from eagle3.process.services import Supervisor, state_dir_for

    save = cfg.phase_dir("train") / "checkpoints"
    sup = Supervisor(state_dir_for(cfg.run_dir))
    outcome: dict = {}

    def phase():
        try:
            outcome["result"] = run_train(cfg, sup).details
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = e

    worker = threading.Thread(target=phase)
    worker.start()
    t0, seen = time.monotonic(), {}
    try:
        while len(seen) < 2:
            assert worker.is_alive(), f"the phase ended before it could be stopped: {outcome!r}"
            assert time.monotonic() - t0 < deadline_s, f"epochs {after} were not saved within {deadline_s} s: {seen}"
            for name in after:
                if name not in seen and (save / name / "training_state.json").is_file():
                    seen[name] = time.monotonic()
            time.sleep(poll_s)
        epoch_s = seen[after[1]] - seen[after[0]]
        time.sleep(0.4 * epoch_s)
    finally:
        sup.stop_all()
        worker.join(timeout=300)
    assert not worker.is_alive(), "the phase did not return after the stop"
    assert isinstance(outcome.get("error"), TrainingStopped), outcome
    assert (save / "interrupted" / "model.safetensors").is_file(), sorted(p.name for p in save.iterdir())
    return f"stopped {0.4 * epoch_s:.2f} s after epoch {after[1]} was saved (epoch ~{epoch_s:.2f} s)"


def test_train_stop_resume_gate(tmp_path):
    from eagle3.drafters.loadable import check_drafter
    from eagle3.phases.train import run_train
    from eagle3.process.services import Supervisor, state_dir_for

    cfg = _config(tmp_path)
    _install_phase2(cfg)
    log = cfg.phase_dir("train") / "logs" / "train.log"

    # Run 1: stopped during epoch 2; the trainer saves interrupted/ within its grace period.
    where = train_and_stop_mid_epoch(cfg, after=("0", "1"))
    save = cfg.phase_dir("train") / "checkpoints"
    assert (save / "0" / "training_state.json").is_file()
    first_log_len = len(log.read_text(errors="replace"))
    if OUT:
        shutil.copy2(save / "interrupted" / "scheduler_state_dict.pt", Path(OUT) / "interrupted_scheduler_state_dict.pt")

    # Run 2: resumes (interrupted/ adopted as the epoch it was cut in), trains to the end, gates.
    manifest = run_train(cfg, Supervisor(state_dir_for(cfg.run_dir))).details
    second = log.read_text(errors="replace")[first_log_len:]
    if OUT:
        out = Path(OUT)
        (out / "trained").mkdir(exist_ok=True)
        for name in ("config.json", "model.safetensors"):
            shutil.copy2(Path(manifest["checkpoint"]) / name, out / "trained" / name)
        shutil.copy2(log, out / "train.log")
        (out / "train_manifest.json").write_text(json.dumps({**manifest, "stopped": where}, indent=2))
    assert manifest["trained"] is True and manifest["status"] == "TRAINED"
    assert manifest["epochs_completed"] == EPOCHS
    actions = " ".join(manifest["resume"]["actions"])
    assert "interrupted/" in actions, manifest["resume"]
    assert "Resuming" in second, second[-3000:]
    assert "Training epoch 1/" not in second, "run 2 started over instead of resuming"
    assert "No previous training checkpoint" not in second
    report = check_drafter(manifest["checkpoint"], "vllm", target=TARGET, expected_aux_ids=[2, 4, 5])
    assert report.ok, report.render()
    assert manifest["gate"]["ok"] and manifest["aux_layer_ids"] == [2, 4, 5]
