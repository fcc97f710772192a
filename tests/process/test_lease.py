"""Run and GPU leases, with real holder processes: a second run refuses at once naming the holder,
waits when asked, and a holder killed with -9 never leaves a lease stuck."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from eagle3.process import procfs
from eagle3.process.lease import LeaseBusy, gpu_holders, hold, lease_holder, run_lease_path

PY = sys.executable
EAGLE3 = str(Path(PY).parent / "eagle3")


def holder_script(run_dir: Path, gpus: list[int], hold_s: float = 300.0) -> str:
    return textwrap.dedent(f"""
        import time
        from eagle3.process.lease import hold
        with hold({str(run_dir)!r}, {gpus!r}):
            print("ready", flush=True)
            time.sleep({hold_s})
    """)


@pytest.fixture
def holder(spawner, tmp_path):
    """Start a process that holds a run dir's lease (and GPUs); returns (process, run_dir)."""

    def _start(run_dir: Path | None = None, gpus: list[int] = (), hold_s: float = 300.0):
        run_dir = run_dir or tmp_path / "run-a"
        proc = spawner.start(holder_script(run_dir, list(gpus), hold_s))  # returns once it holds the lease
        return proc, run_dir

    return _start


def test_second_holder_is_refused_at_once_naming_the_first(holder):
    proc, run_dir = holder()
    t0 = time.monotonic()
    with pytest.raises(LeaseBusy) as err:
        with hold(run_dir):
            pass
    assert time.monotonic() - t0 < 1.0
    msg = str(err.value)
    assert f"PID {proc.pid}" in msg and "-c" in msg and str(run_dir.resolve()) in msg and "since 20" in msg
    assert err.value.holder["start_ticks"] == procfs.start_ticks(proc.pid)
    assert proc.poll() is None


def test_status_readers_do_not_take_the_lease(holder):
    proc, run_dir = holder()
    for _ in range(20):
        assert lease_holder(run_dir)["pid"] == proc.pid
    with pytest.raises(LeaseBusy):
        with hold(run_dir):
            pass


def test_holder_killed_with_sigkill_leaves_nothing_stuck(holder):
    proc, run_dir = holder()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    t0 = time.monotonic()
    with hold(run_dir) as me:
        assert me["pid"] == os.getpid()
        assert lease_holder(run_dir)["pid"] == os.getpid()
    assert time.monotonic() - t0 < 1.0
    assert lease_holder(run_dir) is None
    assert run_lease_path(run_dir).exists()  # the lock file stays; only the kernel lock mattered


def test_wait_takes_the_lease_once_the_holder_ends(holder):
    proc, run_dir = holder(hold_s=2.0)
    t0 = time.monotonic()
    with hold(run_dir, wait_s=30):
        waited = time.monotonic() - t0
    assert 0.5 < waited < 10, waited
    assert proc.wait(timeout=10) == 0


def test_wait_that_runs_out_says_how_long_it_waited(holder):
    proc, run_dir = holder()
    t0 = time.monotonic()
    with pytest.raises(LeaseBusy, match=r"waited 1 s"):
        with hold(run_dir, wait_s=1.0):
            pass
    assert 0.9 < time.monotonic() - t0 < 3


def test_overlapping_gpus_of_another_run_dir_are_refused_naming_gpu_and_holder(holder, tmp_path):
    proc, run_a = holder(gpus=[0, 1])
    with pytest.raises(LeaseBusy) as err:
        with hold(tmp_path / "run-b", [1, 2]):
            pass
    msg = str(err.value)
    assert "GPU 1" in msg and f"PID {proc.pid}" in msg and str(run_a.resolve()) in msg
    assert lease_holder(tmp_path / "run-b") is None, "a refused run must give back the run lease it took"
    assert gpu_holders([2]) == {}, "and every GPU it took before the busy one"
    with hold(tmp_path / "run-c", [2, 3]):  # disjoint GPUs run side by side
        assert set(gpu_holders([0, 1, 2, 3])) == {0, 1, 2, 3}


def test_leases_are_reentrant_within_one_process(tmp_path):
    with hold(tmp_path / "run", [5]):
        with hold(tmp_path / "run", [5]):  # eagle3 run holds it, and the flow it runs takes it again
            assert lease_holder(tmp_path / "run")["pid"] == os.getpid()
        assert lease_holder(tmp_path / "run")["pid"] == os.getpid(), "the inner release must not free it"
    assert lease_holder(tmp_path / "run") is None and gpu_holders([5]) == {}


def test_lease_file_is_not_inherited_by_children(tmp_path):
    """A service launched while the lease is held must not keep it after the run dies."""
    with hold(tmp_path / "run"):
        child = subprocess.Popen([PY, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert lease_holder(tmp_path / "run") is None
    finally:
        child.kill()
        child.wait()


# ---- every entry point -------------------------------------------------------------------------------

def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([EAGLE3, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_cli_handoff_on_a_held_run_dir_exits_3_and_touches_nothing(holder, tmp_path):
    proc, run_dir = holder()
    res = _cli("handoff", "--run-dir", str(run_dir), "--gpus", "none")
    assert res.returncode == 3, res.stderr
    assert f"PID {proc.pid}" in res.stderr and "nothing was started or stopped" in res.stderr
    assert not (run_dir / "handoffs").exists(), "a refused handoff must not even write a report"
    assert proc.poll() is None


def test_cli_run_refuses_when_its_gpus_are_held_by_another_run_dir(holder, make_config, tmp_path):
    proc, _ = holder(tmp_path / "other-run", gpus=[0, 1])
    cfg = make_config({"gpus": [1]}, check_files=False)
    res = _cli("run", str(tmp_path / "config.yaml"), "--no-doctor")
    assert res.returncode == 3, res.stderr
    assert "GPU 1" in res.stderr and f"PID {proc.pid}" in res.stderr
    assert not (cfg.run_dir / "handoffs").exists() and not (cfg.run_dir / "logs").exists()


def test_cli_wait_proceeds_once_the_holder_is_gone(holder, tmp_path):
    proc, run_dir = holder(hold_s=2.0)
    t0 = time.monotonic()
    res = _cli("handoff", "--run-dir", str(run_dir), "--gpus", "none", "--wait", "30")
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 > 1.0
    assert list((run_dir / "handoffs").glob("*.json"))
