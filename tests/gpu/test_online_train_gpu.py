"""Issue 19 on a real GPU: `speculators train` (0.9.0) consuming hidden states on demand, offline vs
online, for the same samples, under the pack's train phase; then an online run stopped with SIGTERM
through the supervisor and resumed.

The GPU machine has no vLLM, so the extraction server is tests/gpu/hs_endpoint.py, launched by the
pack as its `vllm` (same argv, same Supervisor service, same readiness probe): it speaks vLLM's
extraction contract and writes, per request, a copy of the file the real vLLM CPU build wrote for
that prompt on the CPU machine (a phase-2 output carried over). The trainer, its data loader's
on-demand path (request, lock wait, load, check, delete), its checkpoints and resume are real. It
computes nothing, so online samples/s here is the trainer's plus the transfer's cost, not a real
extraction server's.

    eagle3 datagen CFG && eagle3 extract CFG   # CFG: tiny-cpu.yaml, target.model = tests/fixtures/eagle3-tiny/target
    cp -r RUN_DIR/extract .carry/i19gpu/phase2 # or EAGLE3_GPU_ONLINE_PHASE2=DIR

Needs 2 GPUs (server set [1], trainer set [0]: online mode validates two disjoint sets; the offline
run trains on [0] alone). EAGLE3_GPU_RESULTS, when set, gets one JSON line per measurement.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.gpu.test_train_gpu import ENGINE_PYTHON, TARGET, _engine_bin, train_and_stop_mid_epoch

REPO = Path(__file__).resolve().parents[2]
STANDIN_VLLM = REPO / "tests" / "reliability" / "standin_vllm"
PHASE2 = Path(os.environ.get("EAGLE3_GPU_ONLINE_PHASE2", str(REPO / ".carry" / "i19gpu" / "phase2")))
RESULTS = os.environ.get("EAGLE3_GPU_RESULTS")
EPOCHS = 5
SAMPLE_S = 0.005  # the test's own look at the cache: 20× the pack's guard rate

pytestmark = [pytest.mark.gpu, pytest.mark.slow, pytest.mark.engine,
              pytest.mark.skipif(not shutil.which("nvidia-smi"), reason="needs an NVIDIA GPU"),
              pytest.mark.skipif(not (PHASE2 / "manifest.json").is_file(),
                                 reason=f"no phase-2 output at {PHASE2} (see the module docstring)")]


def _record(kind: str, **data) -> dict:
    row = {"test": "online_train", "kind": kind, **data}
    if RESULTS:
        with open(RESULTS, "a") as fh:
            fh.write(json.dumps(row) + "\n")
    return row


def _config(tmp: Path, mode: str, epochs: int = EPOCHS):
    from eagle3.config import load_config

    python = _engine_bin(tmp)
    (python.parent / "vllm").write_text(f"#!/bin/sh\nexec {ENGINE_PYTHON} {Path(__file__).with_name('hs_endpoint.py')} \"$@\"\n")
    (python.parent / "vllm").chmod(0o755)
    env = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "EAGLE3_STANDIN_HS_DIR": str(PHASE2 / "hidden_states")}
    server = {"port": 18790, "extra_args": [], "startup_timeout_s": 60}
    online = mode == "online"
    raw = {
        "name": f"gpu-{mode}", "run_dir": str(tmp / "run"), "gpus": [0, 1] if online else [0],
        "target": {"model": str(TARGET), "served_name": "tiny-llama", "dtype": "float32", "max_model_len": 1024},
        # vLLM's side answers the pack's engine probe with the stand-in parser (the machine may have no vLLM).
        "engines": {"vllm": {"python": str(python), "env": {**env, "PYTHONPATH": str(STANDIN_VLLM)}},
                    "speculators": {"python": str(python), "env": env}},
        "datagen": {"prompts": str(REPO / "configs" / "prompts" / "tiny-prompts.jsonl"), "server": server},
        "extract": {"server": {**server, "port": 18791}, "seq_length": 512},
        "hidden_states": ({"mode": "online", "server_gpus": [1], "train_gpus": [0]} if online else {"mode": "offline"}),
        "train": {"epochs": epochs, "lr": 3e-3, "total_seq_len": 256, "draft_vocab_size": 2048,
                  "num_speculative_tokens": 3, "dry_run": "never", "stop_grace_s": 120,
                  "loss_implementation": "eager", "draft_attn_impl": "sdpa",
                  "extra_args": ["--num-workers", "2", "--optimizer", "adamw"]},
        "bench": {"server": {**server, "port": 18792}},
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def _install_phase2(cfg, mode: str) -> dict:
    """The carried phase-2 output as this run's extract dir: offline with its hidden states, online
    without them (the manifest an online phase 2 writes: mode online, hidden_states_dir = the cache)."""

    dst = cfg.phase_dir("extract")
    shutil.copytree(PHASE2, dst, ignore=shutil.ignore_patterns("logs", *(["hidden_states"] if mode == "online" else [])))
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest.update(prepared_data=str(dst / "prepared"), token_freq=str(dst / "prepared" / "token_freq.pt"),
                    target_model=str(TARGET), mode=mode,
                    hidden_states_dir=str(cfg.layout.hs_cache if mode == "online"
                                          else dst / "hidden_states"))
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _dir_bytes(path: Path) -> tuple[int, int]:
    total = files = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0, 0
    for e in entries:
        try:
            total += e.stat().st_size
            files += e.name.endswith(".safetensors")
        except OSError:
            pass  # loaded and deleted between the listing and the stat
    return total, files


class CacheSampler(threading.Thread):
    """The on-demand cache's size every SAMPLE_S (the pack's guard looks every 0.1 s)."""

    def __init__(self, cache: Path):
        super().__init__(daemon=True)
        self.cache, self.stop, self.peak, self.peak_files, self.looks, self.nonzero = cache, threading.Event(), 0, 0, 0, 0

    def run(self):
        while not self.stop.wait(SAMPLE_S):
            size, files = _dir_bytes(self.cache)
            self.looks += 1
            self.nonzero += size > 0
            self.peak, self.peak_files = max(self.peak, size), max(self.peak_files, files)


def _epoch_times(save: Path, epochs: int) -> list[float]:
    return [(save / str(e) / "training_state.json").stat().st_mtime for e in range(epochs)]


def _train(cfg, mode: str, manifest: dict) -> dict:
    """One uninterrupted run of the train phase; throughput from the epoch checkpoints' times."""
    from eagle3.phases.train import run_train
    from eagle3.process.services import Supervisor, state_dir_for

    sampler = CacheSampler(cfg.layout.hs_cache)
    sampler.start()
    t0 = time.monotonic()
    try:
        out = run_train(cfg, Supervisor(state_dir_for(cfg.run_dir))).details
    finally:
        sampler.stop.set()
        sampler.join()
    wall = time.monotonic() - t0
    assert out["trained"] is True and out["epochs_completed"] == EPOCHS and out["gate"]["ok"], out
    times = _epoch_times(cfg.phase_dir("train") / "checkpoints", EPOCHS)
    n = manifest["num_samples"]
    # Steady state: from epoch 1's save to the last (epochs 2..last); the gap from epoch 0's save
    # to epoch 1's holds a one-off ~30 s (first-run warm-up), alike in both modes.
    steady = (EPOCHS - 2) * n / (times[-1] - times[1])
    row = {"mode": mode, "samples": n, "tokens": manifest["total_tokens"], "epochs": EPOCHS,
           "samples_per_s_epochs_2_to_last": round(steady, 2),
           "epoch_s": [round(b - a, 3) for a, b in zip(times, times[1:])],
           "phase_wall_s": round(wall, 1), "global_step": out["global_step"]}
    if mode == "online":
        log = (cfg.phase_dir("train") / "logs" / "vllm-server.log").read_text()
        row.update(requests=log.count("POST /v1/completions"), peak_cache_bytes_sampled_5ms=sampler.peak,
                   peak_cache_files_sampled_5ms=sampler.peak_files, cache_looks=sampler.looks,
                   cache_looks_nonzero=sampler.nonzero, guard=out["online"])
    else:
        row.update(cache_bytes=_dir_bytes(Path(manifest["hidden_states_dir"]))[0])
    return row


def test_online_vs_offline_same_samples(tmp_path):

    # Offline: every hidden state on disk before training starts.
    off_cfg = _config(tmp_path / "offline", "offline")
    off_manifest = _install_phase2(off_cfg, "offline")
    off = _record("offline", **_train(off_cfg, "offline", off_manifest))
    assert off["cache_bytes"] == sum(p.stat().st_size for p in (PHASE2 / "hidden_states").glob("hs_*.safetensors"))

    # Online, the same samples: no hidden state on disk, the trainer asks the endpoint for each.
    on_cfg = _config(tmp_path / "online", "online")
    on_manifest = _install_phase2(on_cfg, "online")
    on = _record("online", **_train(on_cfg, "online", on_manifest))
    n = on_manifest["num_samples"]
    assert on["requests"] >= EPOCHS * n * 0.8, on  # every epoch fetched (nearly) every sample again: no cache kept
    assert 0 < on["peak_cache_bytes_sampled_5ms"] <= on["guard"]["bound"] and on["guard"]["exceeded"] is None, on
    assert on["peak_cache_bytes_sampled_5ms"] < off["cache_bytes"] / 2, (on, off)
    assert not on_cfg.layout.hs_cache.exists()  # purged after the step
    _record("compare", peak_cache_bytes={"offline": off["cache_bytes"], "online_sampled": on["peak_cache_bytes_sampled_5ms"]},
            samples_per_s={"offline": off["samples_per_s_epochs_2_to_last"], "online": on["samples_per_s_epochs_2_to_last"]})


def test_online_stopped_with_sigterm_resumes(tmp_path):
    """Online, stopped mid-epoch (SIGTERM to the trainer's group through the supervisor, which
    ends the stand-in server too) and rerun: the trainer resumes from its interrupt save."""
    from eagle3.phases.train import run_train
    from eagle3.process.services import Supervisor, state_dir_for

    cfg = _config(tmp_path / "resume", "online")
    _install_phase2(cfg, "online")
    log = cfg.phase_dir("train") / "logs" / "train.log"
    # Epochs 1 and 2 (after epoch 1's one-off warm-up) give an epoch's length; stopped ~40 % into epoch 3.
    where = train_and_stop_mid_epoch(cfg, after=("1", "2"), deadline_s=240, poll_s=0.005)
    assert not cfg.layout.hs_cache.exists()  # nothing of the stopped step is kept
    first_len = len(log.read_text(errors="replace"))

    manifest = run_train(cfg, Supervisor(state_dir_for(cfg.run_dir))).details
    second = log.read_text(errors="replace")[first_len:]
    actions = " ".join(manifest["resume"]["actions"])
    _record("resume", stopped=where, resume=manifest["resume"], epochs_completed=manifest["epochs_completed"],
            global_step=manifest["global_step"], online=manifest["online"])
    assert manifest["trained"] is True and manifest["epochs_completed"] == EPOCHS and manifest["gate"]["ok"]
    assert manifest["hidden_states_mode"] == "online"
    assert "interrupted/" in actions, manifest["resume"]
    assert "Resuming" in second and "No previous training checkpoint" not in second, second[-3000:]
    assert not any(f"Training epoch {e}/" in second for e in (1, 2, 3)), "run 2 redid an epoch saved before the stop"
