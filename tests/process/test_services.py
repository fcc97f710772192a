"""Supervised services with real processes: groups, re-parented workers, SIGTERM-deaf processes,
PID reuse, crash recovery, readiness, startup budget, hang watchdog, systemd units."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from eagle3.process import procfs
from eagle3.errors import CommandFailed, HandoffError, ServiceExited, ServiceHung, ServiceStartTimeout
from eagle3.handoff.gpus import gpu_sampler
from eagle3.process.services import (OWNER_ENV, SERVICE_ENV, Entry, HttpProbe, LaunchSpec, LogProbe, Registry, Supervisor, Watchdog, state_dir_for)
from eagle3.handoff.systemd import stop_units
from tests.fakegpu import FakeGpuBackend
from tests.procutil import DEAF, HOLD, PY, SLEEP, gone, wait_until
from tests.ports import free_port

pytestmark = pytest.mark.timeout(60)

# A launcher that starts two workers in its own group and exits: the workers re-parent to PID 1
# (or the nearest subreaper) and are no longer its children, as vLLM/SGLang workers do.
LAUNCHER = textwrap.dedent("""
    import json, subprocess, sys, time
    kids = [subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(1)"]) for _ in range(2)]
    open(sys.argv[1] + ".tmp", "w").write(json.dumps([k.pid for k in kids]))
    import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    print("launched", flush=True)
""")


@pytest.fixture
def sup(tmp_path):
    s = Supervisor(state_dir_for(tmp_path / "run"))
    yield s
    s.stop_all()
    s.sweep(0.5)


def spec(tmp_path, code: str, *args: str, name: str = "svc", **kw) -> LaunchSpec:
    return LaunchSpec(name=name, argv=[PY, "-c", code, *args], log=tmp_path / "logs" / f"{name}.log", **kw)


def wait_log(path: Path, line: str, timeout: float = 10.0) -> None:
    """Wait for a whole log line (the launch header quotes the argv, so substrings would match early)."""
    wait_until(lambda: path.exists() and line in path.read_text().splitlines(), timeout, f"{line!r} in {path}")


def test_reparented_workers_are_stopped_through_the_group(tmp_path, sup, spawner):
    pids_file = tmp_path / "workers.json"
    proc = sup.launch(spec(tmp_path, LAUNCHER, str(pids_file), name="launcher"))
    workers = wait_until(lambda: pids_file.exists() and json.loads(pids_file.read_text()), what="worker PIDs")
    for pid in workers:
        spawner.track(pid)
    wait_until(lambda: proc.poll() is not None, what="launcher exit")
    for pid in workers:  # re-parented away from the launcher, still in its group
        info = procfs.read_stat(pid)
        assert info.ppid != proc.pid and info.pgid == proc.pid
    outcome = proc.stop(grace_s=5)
    assert outcome.signal == "SIGTERM" and outcome.clean
    assert sorted(m["pid"] for m in outcome.members) == sorted(workers)
    assert all(gone(pid) for pid in workers)
    assert sup.registry.entries() == []


def test_sigterm_deaf_process_gets_sigkill_after_the_grace(tmp_path, sup):
    proc = sup.launch(spec(tmp_path, DEAF))
    wait_log(proc.spec.log, "ready")
    t0 = time.monotonic()
    outcome = proc.stop(grace_s=0.5)
    assert outcome.signal == "SIGKILL" and outcome.clean
    assert 0.5 <= time.monotonic() - t0 < 5
    assert gone(proc.pid)
    assert proc.popen.returncode == -signal.SIGKILL


def test_polite_process_ends_on_sigterm_without_waiting_the_grace(tmp_path, sup):
    proc = sup.launch(spec(tmp_path, SLEEP))
    wait_log(proc.spec.log, "ready")
    t0 = time.monotonic()
    outcome = proc.stop(grace_s=30)
    assert outcome.signal == "SIGTERM" and gone(proc.pid)
    assert time.monotonic() - t0 < 3


def test_crashed_orchestrator_leaves_a_registry_that_a_new_one_sweeps(tmp_path, spawner):
    state = state_dir_for(tmp_path / "run")
    crash = textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from eagle3.process.services import LaunchSpec, Supervisor
        sup = Supervisor({str(state)!r})
        p = sup.launch(LaunchSpec(name="orphan", argv=[sys.executable, "-c", {SLEEP!r}], log=Path({str(tmp_path / "o.log")!r})))
        print(p.pid, flush=True)
        os._exit(0)  # no cleanup: the orchestrator "crashed"
    """)
    out = subprocess.run([PY, "-c", crash], capture_output=True, text=True, check=True, timeout=30)
    orphan = int(out.stdout.split()[0])
    spawner.track(orphan)
    wait_until(lambda: procfs.alive(orphan) and procfs.read_stat(orphan).ppid != os.getpid(), what="orphan")
    outcomes = Supervisor(state).sweep(default_grace_s=5)
    assert [o.name for o in outcomes] == ["orphan"] and outcomes[0].clean
    assert gone(orphan)
    assert Registry(state).entries() == []


def test_registry_entry_whose_pid_was_reused_is_left_alone(tmp_path, spawner):
    stranger = spawner.start(SLEEP)  # own session: its pgid is its PID, as a reused leader's would be
    state = state_dir_for(tmp_path / "run")
    reg = Registry(state)
    ticks = procfs.start_ticks(stranger.pid)
    reg.add(Entry(id="old-1", name="old", phase="datagen", pid=stranger.pid, pgid=stranger.pid,
                  start_time=procfs.start_time(stranger.pid) - 100, argv=["vllm", "serve"], log="x",
                  start_ticks=ticks - 500))
    outcomes = Supervisor(state).sweep(default_grace_s=0.5)
    assert outcomes[0].signal == "skipped" and "start time differs" in outcomes[0].note
    assert stranger.poll() is None and procfs.alive(stranger.pid)
    assert reg.entries() == []  # our group is gone: the stale entry is dropped


def test_legacy_entry_without_ticks_still_guards_by_start_time(tmp_path, spawner):
    stranger = spawner.start(SLEEP)
    state = state_dir_for(tmp_path / "run")
    Registry(state).add(Entry(id="old-2", name="old", phase="", pid=stranger.pid, pgid=stranger.pid,
                              start_time=procfs.start_time(stranger.pid) - 3600, argv=["x"], log="x"))
    assert Supervisor(state).sweep(default_grace_s=0.5)[0].signal == "skipped"
    assert procfs.alive(stranger.pid)


def test_worker_that_left_the_group_is_found_by_its_markers(tmp_path, sup, spawner):
    escape = textwrap.dedent("""
        import os, subprocess, sys
        kid = subprocess.Popen([sys.executable, "-c", "import os, time\\nos.setsid()\\nwhile True: time.sleep(1)"])
        print(kid.pid, flush=True)
        import time
        while True: time.sleep(1)
    """)
    proc = sup.launch(spec(tmp_path, escape))
    wait_until(lambda: proc.spec.log.read_text().strip().splitlines()[-1].isdigit(), what="child pid")
    kid = int(proc.spec.log.read_text().strip().splitlines()[-1])
    spawner.track(kid)
    wait_until(lambda: procfs.read_stat(kid) and procfs.read_stat(kid).pgid == kid, what="setsid")
    assert procfs.environ_value(kid, SERVICE_ENV) == proc.entry.id
    outcome = proc.stop(grace_s=2)
    assert outcome.clean and gone(kid) and gone(proc.pid)
    assert any(m.get("escaped") and m["pid"] == kid for m in outcome.members)


def test_owner_token_persists_per_run_dir(tmp_path):
    state = state_dir_for(tmp_path / "run")
    assert Registry(state).token == Registry(state).token
    assert Registry(state).token != Registry(state_dir_for(tmp_path / "other")).token


def test_launch_sets_markers_env_cwd_and_gpu_order(tmp_path, sup):
    code = "import json, os\nprint(json.dumps({k: os.environ.get(k) for k in " \
           "['EAGLE3_OWNER_TOKEN', 'EAGLE3_SERVICE_ID', 'CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'X']}), os.getcwd())"
    rc = sup.run(spec(tmp_path, code, env={"X": "1"}, cwd=tmp_path, gpus=[2, 3]))
    assert rc == 0
    line = [l for l in (tmp_path / "logs" / "svc.log").read_text().splitlines() if l.startswith("{")][-1]
    env, cwd = line.rsplit(" ", 1)
    env = json.loads(env)
    assert env[OWNER_ENV] == sup.registry.token and env[SERVICE_ENV].startswith("svc-")
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["X"] == "1"
    assert cwd == str(tmp_path)


def test_argv_must_be_a_list_of_strings(tmp_path):
    with pytest.raises(TypeError):
        LaunchSpec(name="bad", argv="python -c 1", log=tmp_path / "l")  # a shell string is refused
    with pytest.raises(TypeError):
        LaunchSpec(name="bad", argv=[], log=tmp_path / "l")


def test_secrets_are_masked_in_registry_and_log(tmp_path, sup):
    proc = sup.launch(spec(tmp_path, SLEEP, "--api-key", "s3cret", secrets=["s3cret"]))
    wait_log(proc.spec.log, "ready")
    assert "s3cret" not in json.dumps([e.__dict__ for e in sup.registry.entries()])
    assert "s3cret" not in proc.spec.log.read_text()
    proc.stop(0.5)


# ---- readiness, startup budget, watchdog ---------------------------------------------------

def test_http_probe_refused_means_starting_then_ready(tmp_path, sup):
    port = free_port()
    probe = HttpProbe(f"http://127.0.0.1:{port}/")
    assert probe.ready() is False  # connection refused: still starting
    delayed = f"import time, runpy, sys\ntime.sleep(0.5)\nsys.argv=['http.server','{port}','--bind','127.0.0.1']\n" \
              "runpy.run_module('http.server', run_name='__main__')"
    proc = sup.launch(spec(tmp_path, delayed, cwd=tmp_path))
    waited = proc.wait_ready([probe], timeout_s=20, poll_s=0.1)
    assert waited >= 0.4 and probe.ready()
    proc.stop(2)
    assert gone(proc.pid)


def test_log_probe_ignores_lines_of_an_earlier_launch(tmp_path, sup):
    first = sup.launch(spec(tmp_path, "print('SERVER READY', flush=True)"))
    wait_log(first.spec.log, "SERVER READY")
    first.wait()
    second = sup.launch(spec(tmp_path, "import time\ntime.sleep(30)"))
    probe = LogProbe(second.spec.log, r"^SERVER READY$")
    assert probe.ready() is False  # the first launch's line must not count
    second.stop(0.5)


def test_log_probe_matches_a_line_split_across_reads(tmp_path):
    log = tmp_path / "l.log"
    log.write_text("==> eagle3: launching x: []\nstarting\nServer rea")
    probe = LogProbe(log, r"Server ready")
    assert not probe.ready()
    with open(log, "a") as fh:
        fh.write("dy on port 1\n")
    assert probe.ready()


def test_log_probe_stays_ready_when_the_line_scrolls_away(tmp_path):
    log = tmp_path / "l.log"
    log.write_text("==> eagle3: launching x: []\nServer ready\n")
    probe = LogProbe(log, r"^Server ready$")
    assert probe.ready()
    with open(log, "a") as fh:
        fh.write("noise\n" * 5000)  # e.g. while an HTTP probe is still failing
    assert probe.ready()


def test_exit_before_ready_fails_fast_with_the_log_tail(tmp_path, sup):
    proc = sup.launch(spec(tmp_path, "import sys\nprint('CUDA out of memory', flush=True)\nsys.exit(3)"))
    t0 = time.monotonic()
    with pytest.raises(ServiceExited) as err:
        proc.wait_ready([LogProbe(proc.spec.log, "never")], timeout_s=60, poll_s=0.05)
    assert time.monotonic() - t0 < 5
    assert "code 3" in str(err.value) and "CUDA out of memory" in err.value.log_tail
    assert err.value.retryable


def test_startup_budget_tears_the_service_down(tmp_path, sup):
    proc = sup.launch(spec(tmp_path, SLEEP))
    with pytest.raises(ServiceStartTimeout):
        proc.wait_ready([LogProbe(proc.spec.log, "never")], timeout_s=0.5, poll_s=0.05)
    assert gone(proc.pid) and sup.registry.entries() == []


def test_silent_service_is_declared_hung_and_torn_down(tmp_path, sup):
    proc = sup.launch(spec(tmp_path, SLEEP, hang_timeout_s=0.6))
    with pytest.raises(ServiceHung) as err:
        proc.wait_ready([LogProbe(proc.spec.log, "never")], timeout_s=30, poll_s=0.05)
    assert err.value.retryable and gone(proc.pid)


def test_chatty_service_is_not_declared_hung(tmp_path, sup):
    chatty = "import time\nwhile True:\n    print('tick', flush=True)\n    time.sleep(0.1)"
    proc = sup.launch(spec(tmp_path, chatty, hang_timeout_s=0.5))
    with pytest.raises(ServiceStartTimeout):  # the budget ends it, not the watchdog
        proc.wait_ready([LogProbe(proc.spec.log, "never")], timeout_s=1.5, poll_s=0.05)
    assert gone(proc.pid)


# HOLD keeps the fake GPUs' device files open (the fake shows its memory) and stays silent; this logs too.
GPU_CHATTY = HOLD.replace("while True: time.sleep(1)", "while True: print('tick', flush=True); time.sleep(0.1)")


def gpu_supervisor(tmp_path, fake: FakeGpuBackend) -> Supervisor:
    return Supervisor(state_dir_for(tmp_path / "run"), gpu_sample=gpu_sampler(lambda: fake))


def test_spinning_deadlock_is_hung_whatever_the_utilisation(tmp_path):
    """The NCCL drill's picture on 2 x H200: rank 0 spins in the collective (100 %), rank 1 waits (0 %),
    both hold their memory still, the log is silent."""
    fake = FakeGpuBackend(tmp_path / "dev", count=2)
    fake.util = [100, 0]
    sup = gpu_supervisor(tmp_path, fake)
    try:
        proc = sup.launch(spec(tmp_path, HOLD, str(fake.device(0)), str(fake.device(1)), gpus=[0, 1],
                               hang_timeout_s=0.5))
        wait_log(proc.spec.log, "ready")  # holding both GPUs: from here on nothing moves
        t0 = time.monotonic()
        with pytest.raises(ServiceHung) as err:
            proc.wait_ready([LogProbe(proc.spec.log, "never")], timeout_s=20, poll_s=0.05)
        assert time.monotonic() - t0 < 0.5 + 3.0  # the teardown's SIGTERM is included
        msg = str(err.value)
        assert msg.startswith("svc hung during startup: no log output for ")
        assert re.search(r"GPU memory unchanged for \d+ s on GPUs \[0, 1\] \(512/512 MiB used; utilisation 100/0 %", msg)
        assert gone(proc.pid) and sup.registry.entries() == []
    finally:
        sup.sweep(0.5)


@pytest.mark.parametrize("case", ["memory growing", "log growing", "GPUs unreadable"])
def test_progressing_or_unverifiable_startup_is_not_declared_hung(tmp_path, case):
    fake = FakeGpuBackend(tmp_path / "dev", count=2)
    fake.util = [100, 100]  # busy either way: utilisation decides nothing
    if case == "GPUs unreadable":
        fake.error = "GPU is lost"
    done = threading.Event()

    def allocate():  # a model load: GPU 0's memory keeps growing, silently
        while not done.wait(0.2):
            fake.stuck_mib[0] += 64

    sup = gpu_supervisor(tmp_path, fake)
    grower = threading.Thread(target=allocate, daemon=True)
    try:
        if case == "memory growing":
            grower.start()
        code = GPU_CHATTY if case == "log growing" else HOLD
        proc = sup.launch(spec(tmp_path, code, str(fake.device(0)), str(fake.device(1)), gpus=[0, 1],
                               hang_timeout_s=0.8))
        with pytest.raises(ServiceStartTimeout):  # the budget ends it after 3 x hang_timeout_s, not the watchdog
            proc.wait_ready([LogProbe(proc.spec.log, "never")], timeout_s=2.4, poll_s=0.05)
        assert gone(proc.pid)
    finally:
        done.set()
        sup.sweep(0.5)
    if case == "memory growing":
        assert fake.stuck_mib[0] >= 64 * 10


def test_watchdog_counts_one_more_passing_probe_as_progress(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("x")
    dog = Watchdog(log, silence_s=0.3)
    assert not dog.hung(0)
    time.sleep(0.35)
    assert not dog.hung(1)  # e.g. the log probe passed, the HTTP probe not yet
    time.sleep(0.35)
    assert dog.hung(1) and "1 readiness probe(s) passing, no more since" in dog.describe()


WRITER = textwrap.dedent("""
    import pathlib, sys, time
    out = pathlib.Path(sys.argv[1])
    for i in range(12):  # a trainer between log lines, writing checkpoints
        (out / f"step-{i}.pt").write_bytes(b"x" * 1024)
        time.sleep(0.4)
""")


@pytest.mark.parametrize("watched", [True, False])
def test_one_shot_command_writing_outputs_is_progressing(tmp_path, sup, watched):
    out = tmp_path / "out"
    out.mkdir()
    # 0.4 s between writes, 2 s of silence allowed: a 5x margin for a loaded box, and still hung
    # well before the 12th write (4.8 s) when the writes are not watched.
    cmd = spec(tmp_path, WRITER, str(out), hang_timeout_s=2.0, progress_paths=[out] if watched else [])
    if watched:
        assert sup.run(cmd, timeout_s=30) == 0 and len(list(out.iterdir())) == 12
    else:
        with pytest.raises(ServiceHung, match="svc hung: no log output for"):
            sup.run(cmd, timeout_s=30)
        assert len(list(out.iterdir())) < 12


def test_service_that_survives_sigkill_is_reported_with_its_kernel_state(tmp_path, sup, monkeypatch, freezer):
    monkeypatch.setattr("eagle3.process.terminate.KILL_WAIT_S", 0.5)
    proc = sup.launch(spec(tmp_path, DEAF))
    wait_log(proc.spec.log, "ready")
    freezer.freeze(proc.pid)
    outcome = proc.stop(0.3)
    assert not outcome.clean and outcome.survivors == [proc.pid] and outcome.signal == "SIGKILL"
    [stuck] = outcome.stuck
    assert (stuck["pid"], stuck["state"], stuck["comm"]) == (proc.pid, "D", os.path.basename(PY)[:15])
    assert outcome.note.startswith(f"survived SIGKILL (PID {proc.pid}: state D (disk sleep: uninterruptible")
    assert [e.id for e in sup.registry.entries()] == [proc.entry.id]  # kept for the next sweep
    freezer.thaw()
    assert proc.stop(0.3).clean and gone(proc.pid)


def test_watchdog_without_gpus_needs_silence_only(tmp_path):
    log = tmp_path / "w.log"
    log.write_text("x")
    dog = Watchdog(log, silence_s=0.2)
    assert not dog.hung()
    time.sleep(0.25)
    assert dog.hung()
    log.write_text("xy")
    assert not dog.hung()


def test_one_shot_command_failure_carries_code_and_tail(tmp_path, sup):
    with pytest.raises(CommandFailed) as err:
        sup.run(spec(tmp_path, "import sys\nprint('bad shard', flush=True)\nsys.exit(7)"), retryable_codes={7})
    assert err.value.returncode == 7 and err.value.retryable and "bad shard" in err.value.log_tail
    with pytest.raises(CommandFailed) as err:
        sup.run(spec(tmp_path, "import sys\nsys.exit(2)"))
    assert not err.value.retryable
    assert sup.run(spec(tmp_path, "pass")) == 0
    assert sup.registry.entries() == []


def test_one_shot_command_leaves_nothing_of_its_group_behind(tmp_path, sup, spawner):
    pids_file = tmp_path / "w.json"
    assert sup.run(spec(tmp_path, LAUNCHER, str(pids_file))) == 0
    workers = json.loads(pids_file.read_text())
    for pid in workers:
        spawner.track(pid)
    assert all(gone(pid) for pid in workers)


# ---- systemd units ---------------------------------------------------------------------------

def fake_systemctl(tmp_path: Path, service_pid_file: Path) -> Path:
    """systemd cannot run here (it must be PID 1), so a stand-in `systemctl` does what a unit
    stop does to a real service process: SIGTERM it and wait until it is gone."""
    exe = tmp_path / "bin" / "systemctl"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(textwrap.dedent(f"""\
        #!{PY}
        import os, signal, sys, time
        verb, unit = sys.argv[1], sys.argv[2]
        state = {str(tmp_path)!r} + "/" + unit + ".state"
        if unit == "missing.service":
            print(f"Failed to stop {{unit}}: Unit {{unit}} not loaded.", file=sys.stderr); sys.exit(5)
        if verb == "stop":
            pid = int(open({str(service_pid_file)!r}).read())
            os.kill(pid, signal.SIGTERM)
            while os.path.exists(f"/proc/{{pid}}") and open(f"/proc/{{pid}}/stat").read().split(")")[1].split()[0] != "Z":
                time.sleep(0.02)
            open(state, "w").write("inactive")
        elif verb == "is-active":
            s = open(state).read() if os.path.exists(state) else "active"
            print(s); sys.exit(0 if s == "active" else 3)
    """))
    exe.chmod(0o755)
    return exe


def test_systemd_unit_is_stopped_with_systemctl(tmp_path, spawner):
    service = spawner.start(SLEEP)
    pid_file = tmp_path / "unit.pid"
    pid_file.write_text(str(service.pid))
    exe = fake_systemctl(tmp_path, pid_file)
    records = stop_units(["vllm-kimi.service"], timeout_s=10, systemctl=str(exe))
    assert records[0]["ok"] and records[0]["state"] == "inactive"
    assert service.wait(timeout=5) == -signal.SIGTERM


def test_systemd_unit_failure_is_a_clear_error(tmp_path):
    exe = fake_systemctl(tmp_path, tmp_path / "none")
    with pytest.raises(HandoffError, match="missing.service.*not loaded"):
        stop_units(["missing.service"], timeout_s=10, systemctl=str(exe))


def test_systemd_units_without_systemctl_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no systemctl anywhere on PATH
    with pytest.raises(HandoffError, match="systemctl is not installed"):
        stop_units(["vllm.service"], timeout_s=5)
    assert stop_units([], timeout_s=5) == []  # nothing configured: systemctl is not needed
