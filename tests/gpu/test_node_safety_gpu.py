"""Issue 14 on real NVIDIA GPUs: monitors are observers, not holders; a process that survives
SIGKILL is named with its kernel state; the hang watchdog sees a real NCCL deadlock (one rank
spinning at 100 %) and leaves a slow but progressing load alone.

Run on the H200 machine (skipped where NVML finds no GPU); every process a test starts is ended by
its PID. Results are appended to $EAGLE3_GPU_RESULTS as in test_handoff_gpu.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from eagle3.process import procfs
from eagle3.errors import HandoffError, ServiceHung
from eagle3.handoff.gpus import gpu_sampler
from eagle3.handoff.core import run_handoff
from eagle3.handoff.view import to_markdown
from eagle3.process.services import LaunchSpec, LogProbe, Supervisor, state_dir_for
from tests.ports import free_port
from tests.gpu.test_handoff_gpu import GPUS, HERE, THRESHOLD, nv, record, settings, used, wait_until  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(GPUS == 0, reason="no NVIDIA GPU (NVML unavailable or 0 devices)")]

HANG_S = 10.0  # hang_timeout_s of the watchdog tests: above the silent `import torch` of a warm machine
NVML_READER = "import time, pynvml\npynvml.nvmlInit()\nprint('ready', flush=True)\nwhile True: time.sleep(1)\n"


@pytest.fixture
def idle(nv):
    """Every GPU reads (near) 0 MiB before a test measures anything."""
    wait_until(lambda: all(used(nv, i) <= THRESHOLD for i in range(GPUS)), 30, "all GPUs idle before the test")


@pytest.fixture
def gsup(tmp_path):
    """A supervisor whose watchdog reads the GPUs through real NVML, as the pipeline's does."""
    s = Supervisor(state_dir_for(tmp_path / "run"), gpu_sample=gpu_sampler())
    yield s
    s.sweep(1.0)


class Procs:
    """Plain (foreign) processes a test starts, ended by PID at teardown."""

    def __init__(self):
        self.started: list[subprocess.Popen] = []

    def start(self, argv: list[str], env: dict | None = None, ready: str | None = None) -> subprocess.Popen:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True, env={**os.environ, **(env or {})})
        self.started.append(p)
        if ready:
            assert p.stdout.readline().strip() == ready, f"{argv} did not start"
        return p

    def end(self) -> None:
        for p in self.started:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.end()


def _observers(procs: Procs, nv) -> tuple[subprocess.Popen, subprocess.Popen]:
    assert shutil.which("nvidia-smi"), "nvidia-smi not on PATH"
    dmon = procs.start(["nvidia-smi", "dmon", "-d", "1"])
    reader = procs.start([sys.executable, "-c", NVML_READER], ready="ready")
    gpu0 = os.path.realpath(f"/dev/nvidia{nv.snapshot([0])[0].minor}")
    wait_until(lambda: all(gpu0 in procfs.open_paths(p.pid) for p in (dmon, reader)), 30,
               "nvidia-smi dmon and the NVML reader holding the GPU 0 device file")
    listed = {q.pid for s in nv.snapshot() for q in s.processes}
    assert not listed & {dmon.pid, reader.pid}  # what makes them observers: on no NVML process list
    return dmon, reader


def test_monitors_are_observers_and_do_not_block(tmp_path, nv, idle, procs):
    dmon, reader = _observers(procs, nv)
    gpus = list(range(GPUS))
    report = run_handoff(tmp_path / "run", settings(grace_s=2.0, deadline_s=20.0), gpus)
    assert report.ok and [h["pid"] for h in report.holders if h["class"] != "protected"] == []  # protected: this test
    observed = {o["pid"]: o for o in report.observers}
    assert {dmon.pid, reader.pid} <= set(observed) and all(o["class"] == "observer" for o in observed.values())
    md = to_markdown(report)
    assert "Observers (device file open, no GPU context: not blocking)" in md and f"| {dmon.pid} |" in md
    assert dmon.poll() is None and reader.poll() is None  # never signalled
    record("observers_do_not_block", handoff_s=report.seconds, gpu_check=report.gpu_check,
           observers=[{k: o[k] for k in ("pid", "cmd", "gpus", "via")} for o in report.observers],
           used_mib=[g["used_mib"] for g in report.gpus])


def test_observer_beside_a_foreign_cuda_process_only_the_cuda_process_is_named(tmp_path, nv, idle, procs):
    dmon, reader = _observers(procs, nv)
    cuda = procs.start([sys.executable, str(HERE / "cuda_service.py"), "--gib", "1"],
                       env={"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, ready="READY")
    with pytest.raises(HandoffError) as err:
        run_handoff(tmp_path / "run", settings(grace_s=2.0, deadline_s=20.0), [0])
    msg = str(err.value)
    assert f"held by PID {cuda.pid} " in msg and "foreign" in msg
    assert f"PID {dmon.pid}" not in msg and f"PID {reader.pid}" not in msg
    assert {dmon.pid, reader.pid} <= {o["pid"] for o in err.value.report.observers}
    assert all(p.poll() is None for p in (dmon, reader, cuda))
    record("observer_plus_foreign_cuda", message=msg[:500], observers=[o["pid"] for o in err.value.report.observers],
           cuda_pid=cuda.pid)


def test_cuda_service_that_survives_sigkill_is_named_with_state_and_gpu(tmp_path, nv, idle, monkeypatch, freezer):
    """A real CUDA process in state D (frozen by a cgroup-v1 freezer) that SIGKILL cannot end."""
    monkeypatch.setattr("eagle3.process.terminate.KILL_WAIT_S", 3.0)
    sup = Supervisor(state_dir_for(tmp_path / "run"))
    log = tmp_path / "cuda.log"
    proc = sup.launch(LaunchSpec(name="cuda", argv=[sys.executable, str(HERE / "cuda_service.py"), "--gib", "2",
                                                    "--ignore-term"], log=log, gpus=[0], stop_grace_s=2.0))
    try:
        proc.wait_ready([LogProbe(log, r"^READY$")], timeout_s=180, poll_s=0.1)
        held = used(nv, 0)
        freezer.freeze(proc.pid)
        t0 = time.monotonic()
        with pytest.raises(HandoffError) as err:
            run_handoff(tmp_path / "run", settings(grace_s=2.0, deadline_s=60.0), [0], supervisor=sup)
        took = time.monotonic() - t0
        msg = str(err.value)
        assert re.search(rf"^GPU handoff refused: PID {proc.pid} \(.*cuda_service.py .*\) of service cuda .*survived "
                         r"SIGKILL: state D \(disk sleep.*\), wchan \w+; pins GPU 0 \(\d+ MiB by NVML\)", msg)
        assert took < 2.0 + 3.0 + 2.0 + 3.0  # grace, SIGKILL wait, one more grace; not the 60 s deadline
        assert procfs.task_state(proc.pid).state == "D" and used(nv, 0) > 2048
        [stuck] = err.value.report.stuck
        record("survivor_of_sigkill", held_mib=held, refused_after_s=round(took, 3), stuck=stuck, message=msg[:600])
    finally:
        freezer.thaw()  # the pending SIGKILL ends it now
        wait_until(lambda: proc.poll() is not None, 30, "the thawed CUDA process to exit")
    wait_until(lambda: used(nv, 0) <= THRESHOLD, 30, "GPU 0 freed once the survivor could exit")
    sup.sweep(1.0)


@pytest.mark.skipif(GPUS < 2, reason="needs 2 GPUs")
def test_nccl_deadlock_is_declared_hung_whatever_the_utilisation(tmp_path, nv, idle, gsup):
    """The drill's deadlocked group as a service that never gets ready: rank 0 spins in an all-reduce
    rank 1 never joins. The watchdog must fire about HANG_S after the last progress, not wait out the
    startup budget, and the teardown must leave every GPU at 0 MiB."""
    gpus = list(range(GPUS))
    log = tmp_path / "nccl.log"
    proc = gsup.launch(LaunchSpec(name="nccl", argv=[sys.executable, str(HERE / "nccl_ranks.py"), "launcher",
                                                     str(free_port()), str(GPUS), "wait"],
                                  log=log, gpus=gpus, hang_timeout_s=HANG_S, stop_grace_s=3.0))
    t0 = time.monotonic()
    with pytest.raises(ServiceHung) as err:
        proc.wait_ready([LogProbe(log, r"^NEVER$")], timeout_s=240, poll_s=0.5)
    caught = time.monotonic()
    text = log.read_text()
    assert "rank0 entering" in text and "UNREACHABLE" not in text  # it fired on the deadlock, not before
    msg = str(err.value)
    m = re.search(r"no log output for (\d+) s.*GPU memory unchanged for (\d+) s on GPUs \[[\d, ]+\] "
                  r"\(([\d/]+) MiB used; utilisation ([\d/?]+) %", msg)
    assert m, msg
    silent_s, still_s = int(m.group(1)), int(m.group(2))
    wait_until(lambda: all(used(nv, i) <= THRESHOLD for i in gpus), 10, "every GPU freed by the teardown")
    freed = time.monotonic()
    record("nccl_deadlock_declared_hung", hang_timeout_s=HANG_S, log_silent_s=silent_s, memory_still_s=still_s,
           used_mib=m.group(3), util_gpu=m.group(4), wait_ready_s=round(caught - t0, 3),
           freed_after_raise_s=round(freed - caught, 3), teardown=proc.outcome.signal if proc.outcome else None,
           message=msg[:700])
    # Declared once neither signal had moved for HANG_S (whole seconds in the message), promptly.
    assert HANG_S - 1 <= min(silent_s, still_s) <= HANG_S + 3
    assert gsup.registry.entries() == []


@pytest.mark.parametrize("mode", ["logging", "silent"])
def test_slow_progressing_load_is_not_declared_hung(tmp_path, nv, idle, gsup, mode):
    """25 shards of 256 MiB, one a second: about 2.5 x hang_timeout_s of loading. Logging each shard,
    or silent while its memory grows: either is progress, and the load reaches READY."""
    log = tmp_path / f"load-{mode}.log"
    argv = [sys.executable, str(HERE / "slow_load.py"), "--shards", "25", "--every", "1.0"]
    proc = gsup.launch(LaunchSpec(name=f"load-{mode}", argv=argv + (["--silent"] if mode == "silent" else []),
                                  log=log, gpus=[0], hang_timeout_s=HANG_S, stop_grace_s=3.0))
    took = proc.wait_ready([LogProbe(log, r"^READY$")], timeout_s=180, poll_s=0.5)
    held = used(nv, 0)
    assert took > 2 * HANG_S and held > 25 * 256
    proc.stop(3.0)
    wait_until(lambda: used(nv, 0) <= THRESHOLD, 30, "GPU 0 freed")
    record(f"slow_load_{mode}_not_hung", hang_timeout_s=HANG_S, ready_after_s=round(took, 3), held_mib=held)
