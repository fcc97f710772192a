"""A shared node: runs that must not disturb each other, a killed run that the next one cleans up
after, and stops that keep each service's own grace. Real `eagle3 run` processes; engines are the
stand-in (tests/reliability/standin_engine.py) except where a real vLLM CPU server is named."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.process import procfs
from eagle3.fsio import atomic_write_json
from eagle3.process.lease import lease_holder
from eagle3.phase_runner import done_marker, run_phase, supervisor
from eagle3.process.services import Registry, state_dir_for
from tests.flows.flowkit import processes_with_home
from tests.conftest import REPO, requires_engine, write_tiny_config
from tests.ports import free_port
from tests.procutil import wait_until
from tests.reliability.standins import (assert_nothing_left, eagle3_run_env, live, standin_config, stub_model,
                                        write_extract_inputs)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
FIXTURES = REPO / "tests" / "fixtures" / "eagle3-tiny"


def start_run(config: Path, env: dict, log_dir: Path, *args: str, name: str = "run") -> subprocess.Popen:
    out, err = open(log_dir / f"{name}.out", "w"), open(log_dir / f"{name}.err", "w")
    with out, err:
        return subprocess.Popen([EAGLE3, "run", str(config), *args], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=err, start_new_session=True, cwd=log_dir)


def finish(proc: subprocess.Popen, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def registry_entry(cfg, name: str):
    return next((e for e in Registry(state_dir_for(cfg.run_dir)).entries() if e.name == name), None)


# ---- two runs on one config ----------------------------------------------------------------------------

def test_second_run_on_the_same_config_is_refused_and_the_first_is_untouched(tmp_path, prefect_home):
    cfg = standin_config(tmp_path)
    config = tmp_path / "config.yaml"
    env = eagle3_run_env(prefect_home, "signal_phases:TABLE")
    service_file = cfg.phase_dir("datagen") / "service.json"
    first = start_run(config, env, tmp_path, "--no-doctor", name="first")
    try:
        wait_until(lambda: service_file.exists() or first.poll() is not None, 300, "the first run's service", step=0.2)
        assert first.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
        members = [(m["pid"], m["start_ticks"]) for m in json.loads(service_file.read_text())["members"]]
        reports_before = sorted((cfg.run_dir / "handoffs").glob("*.json"))

        t0 = time.monotonic()
        second = subprocess.run([EAGLE3, "run", str(config), "--no-doctor"], env=env, stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=60, cwd=tmp_path)
        took = time.monotonic() - t0
        assert second.returncode == 3, second.stderr[-3000:]
        assert f"PID {first.pid}" in second.stderr and str(cfg.run_dir) in second.stderr
        assert "nothing was started or stopped" in second.stderr and "stopped leftover" not in second.stderr
        assert took < 20, f"the refusal took {took:.1f} s (it must come before any Prefect or engine start)"
        assert all(live(*m) for m in members), "the second run touched the first run's service"
        assert sorted((cfg.run_dir / "handoffs").glob("*.json")) == reports_before, "the second run handed off"
        assert lease_holder(cfg.run_dir)["pid"] == first.pid
        servers = [p.pid for p in processes_with_home(prefect_home) if "uvicorn" in procfs.cmdline(p.pid)]
        assert servers == [registry_entry(cfg, "prefect-server").pid], "one Prefect server per run, the registered one"

        os.kill(first.pid, signal.SIGTERM)
        assert finish(first) == 130
    finally:
        finish(first, timeout=60)
    first_out = (tmp_path / "first.out").read_text() + (tmp_path / "first.err").read_text()
    assert "retry" not in first_out.lower(), "the first run had to retry: it was disturbed"
    assert not any(live(*m) for m in members)
    assert_nothing_left(prefect_home)


# ---- a stop during training keeps the trainer's own grace --------------------------------------------

def trainer_config(tmp_path: Path, save_s: float):
    """Stand-in engines, a stub target shaped like the tiny Llama (so the trained fixture drafter
    passes the gate), datagen marked done and a real (stand-in) extraction finished."""
    files = tmp_path / "trainer-files"
    files.mkdir()
    shutil.copy2(FIXTURES / "drafter-trained" / "config.json", files / "config.json")
    shutil.copy2(FIXTURES / "drafter-trained" / "model.safetensors", files / "model.safetensors")
    shutil.copy2(FIXTURES / "resume" / "optimizer_state_dict.pt", files / "optimizer_state_dict.pt")
    shutil.copy2(FIXTURES / "resume" / "interrupted_scheduler_state_dict_step179.pt",
                 files / "scheduler_state_dict.pt")
    cfg = standin_config(tmp_path, env={"STANDIN_TRAIN_FILES": str(files), "STANDIN_TRAIN_SAVE_S": str(save_s)},
                         overrides={"train": {"stop_grace_s": 30, "epochs": 1}, "handoff": {"grace_s": 1}})
    model = stub_model(tmp_path / "model")
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 8, "hidden_size": 128,
        "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "vocab_size": 4096, "tie_word_embeddings": False}))
    write_extract_inputs(cfg)
    atomic_write_json(cfg.layout.state / "datagen.done.json",
                      {"phase": "datagen", "config": cfg.fingerprint("datagen"), "upstream": None,
                       "fingerprint": "standin-datagen"})
    run_phase(cfg, "extract", supervisor(cfg))
    return cfg


def wait_for_steps(cfg, run: subprocess.Popen, log_dir: Path) -> None:
    log = cfg.phase_dir("train") / "logs" / "train.log"

    def training():
        assert run.poll() is None, (log_dir / "run.err").read_text()[-3000:]
        return log.exists() and "step 3 loss" in log.read_text()

    wait_until(training, 300, "the stand-in trainer to log steps", step=0.2)


def test_sigterm_during_training_gives_the_trainer_its_grace_and_a_rerun_resumes(tmp_path, prefect_home):
    cfg = trainer_config(tmp_path, save_s=4.0)  # the save takes 4 s, handoff.grace_s is 1 s
    config = tmp_path / "config.yaml"
    env = eagle3_run_env(prefect_home, "real_train_phase:TABLE")
    run = start_run(config, env, tmp_path, "--only", "train", "--no-doctor")
    try:
        wait_for_steps(cfg, run, tmp_path)
        os.kill(run.pid, signal.SIGTERM)
        rc = finish(run)
    finally:
        finish(run, timeout=60)
    assert rc == 130, (tmp_path / "run.err").read_text()[-3000:]
    inter = cfg.phase_dir("train") / "checkpoints" / "interrupted"
    assert (inter / "complete").exists(), f"the interrupt save was cut short: {sorted(os.listdir(inter))}"
    assert "saved interrupted/ in" in (cfg.phase_dir("train") / "logs" / "train.log").read_text()

    res = subprocess.run([EAGLE3, "run", str(config), "--only", "train", "--no-doctor"], env=env,
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    log = (cfg.phase_dir("train") / "logs" / "train.log").read_text()
    [resumed] = [line.split(" state ", 1)[1] for line in log.splitlines()
                  if line.startswith("stand-in trainer: resume from 0 state {")]
    assert json.loads(resumed) | {"adopted_from": None} == {"epoch": 0, "global_step": 179, "local_step": 179,
                                                              "adopted_from": None}
    marker = done_marker(cfg, "train")
    assert any("renamed interrupted/ to 0/" in a for a in marker.summary["details"]["resume"]["actions"])
    assert marker.summary["details"]["global_step"] == 180
    assert_nothing_left(prefect_home)


def test_the_next_handoff_stops_a_killed_run_s_trainer_with_the_trainer_s_grace(tmp_path, prefect_home):
    """The registry sweep (not the run's own stop) is what ends the trainer here: it must use the
    30 s recorded with the trainer, not handoff.grace_s (1 s), so the interrupt save completes."""
    cfg = trainer_config(tmp_path, save_s=4.0)
    config = tmp_path / "config.yaml"
    run = start_run(config, eagle3_run_env(prefect_home, "real_train_phase:TABLE"), tmp_path,
                    "--only", "train", "--no-doctor")
    try:
        wait_for_steps(cfg, run, tmp_path)
        trainer = registry_entry(cfg, "train-speculators")
        assert trainer.stop_grace_s == 30
        os.kill(run.pid, signal.SIGKILL)
        finish(run)
    finally:
        finish(run, timeout=30)
    assert live(trainer.pid, trainer.start_ticks), "the trainer should outlive its killed orchestrator"
    res = subprocess.run([EAGLE3, "handoff", str(config), "--after", "train", "--json"], capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL, env=eagle3_run_env(prefect_home))
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout)
    stopped = {s["name"]: s for s in report["services"]}
    assert stopped["train-speculators"]["signal"] == "SIGTERM" and stopped["train-speculators"]["clean"]
    assert stopped["train-speculators"]["seconds"] > 2.0  # it waited for the save, past handoff.grace_s
    assert "prefect-server" in stopped, "the killed run's own Prefect server is ended too"
    inter = cfg.phase_dir("train") / "checkpoints" / "interrupted"
    assert (inter / "complete").exists(), f"the interrupt save was cut short: {sorted(os.listdir(inter))}"
    assert not live(trainer.pid, trainer.start_ticks)
    assert_nothing_left(prefect_home)


# ---- kill -9 of a real run, then a plain rerun ---------------------------------------------------------

def psm_files_of(pids: list[int]) -> set[str]:
    """/dev/shm/psm_* files these processes have open or mapped (Python multiprocessing segments)."""
    found = set()
    for pid in pids:
        found |= {p for p in procfs.open_paths(pid) if p.startswith("/dev/shm/psm_")}
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        found |= {line.split(None, 5)[-1] for line in maps if "/dev/shm/psm_" in line}
    return {p.replace(" (deleted)", "") for p in found if not p.endswith("(deleted)")}


@requires_engine
def test_kill_9_mid_datagen_then_a_plain_rerun_recovers_in_one_go(tiny_model, tmp_path, prefect_home):
    """Real vLLM CPU server. The rerun's first handoff (before its doctor) ends the killed run's
    server group and its Prefect server, purges the /dev/shm segments they left, and the data
    comes out complete: every prompt exactly once."""
    ports = {"datagen": free_port(), "extract": free_port(), "bench": free_port()}
    cfg = write_tiny_config(tmp_path, {
        "name": "kill9", "handoff": {"shm_dir": "/dev/shm"},  # vLLM's psm_* segments land in the real /dev/shm
        # vLLM's worker in a process of its own: its shm_broadcast segments are what this test follows
        "engines": {"vllm": {"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}},
        "datagen": {"max_samples": 16, "concurrency": 2, "sampling": {"max_tokens": 128},
                    "server": {"port": ports["datagen"]}},
        **{p: {"server": {"port": ports[p]}} for p in ("extract", "bench")}})
    config = tmp_path / "config.yaml"
    env = eagle3_run_env(prefect_home)
    samples = cfg.phase_dir("datagen") / "samples.jsonl"
    rows = lambda: len(samples.read_text().splitlines()) if samples.exists() else 0  # noqa: E731
    run = start_run(config, env, tmp_path, "--only", "datagen", name="killed")
    try:
        wait_until(lambda: rows() >= 2 or run.poll() is not None, 480, "some rows of data", step=0.2)
        # Frozen at once: a fast box finishes the 16 rows while the snapshots below are taken, and then
        # there is nothing left to recover. SIGKILL ends a stopped process all the same.
        os.kill(run.pid, signal.SIGSTOP)
        assert run.poll() is None and rows() < 16, (tmp_path / "killed.err").read_text()[-3000:]
        server, prefect = registry_entry(cfg, "datagen-vllm-server"), registry_entry(cfg, "prefect-server")
        group = [(p.pid, p.start_ticks) for p in procfs.group_members(server.pgid)]
        segments = psm_files_of([pid for pid, _ in group])
        assert segments, "vLLM's engine maps multiprocessing segments in /dev/shm; none were found to follow"
        os.kill(run.pid, signal.SIGKILL)
        finish(run)
    finally:
        finish(run, timeout=30)
    assert all(live(*m) for m in group) and live(prefect.pid, prefect.start_ticks), "leftovers to recover from"

    res = subprocess.run([EAGLE3, "run", str(config), "--only", "datagen"], env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "recovery: GPUs free in " in res.stderr and f"datagen-vllm-server (group {server.pgid}" in res.stderr
    recovery = json.loads(sorted((cfg.run_dir / "handoffs").glob("*-recovery-*.json"))[-1].read_text())
    ended = {s["name"]: s for s in recovery["services"]}
    assert ended["datagen-vllm-server"]["clean"] and {m["pid"] for m in ended["datagen-vllm-server"]["members"]} \
        >= {pid for pid, _ in group}
    assert ended["prefect-server"]["clean"]
    assert not any(live(*m) for m in group) and not live(prefect.pid, prefect.start_ticks)
    assert not [s for s in segments if os.path.exists(s)], f"segments of the killed run left: {segments}"
    ids = [json.loads(line)["id"] for line in samples.read_text().splitlines()]
    assert len(ids) == 16 and len(set(ids)) == 16
    assert "retry" not in res.stderr.lower() and "retry" not in res.stdout.lower()
    assert_nothing_left(prefect_home)
