"""Fault injection with real processes: an orchestrator SIGKILLed mid-phase, servers that never get
ready or hang, retries that stop on a repeated failure, SIGTERM/SIGINT to `eagle3 run`, a port taken
before start, a disk that fills up during extraction, a protected daemon on a GPU device file, a
live multiprocessing semaphore in /dev/shm.

Engines are the stand-in of standin_engine.py, launched by the pack's own code (Supervisor,
start_server, the real datagen/extract phases, the real `eagle3 run` flow). Faults already proven
elsewhere are not repeated here; docs/reliability.md points at those tests."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from eagle3.process import procfs
from eagle3.handoff import shm
from eagle3.config import Handoff
from eagle3.engines.serving import PortBusy, start_server
from eagle3.errors import CommandFailed, HandoffError, PipelineError, ServiceHung, ServiceStartTimeout
from eagle3.handoff.core import handoff_for_config, run_handoff
from eagle3.phases.datagen import run_datagen
from eagle3.phases.extract import ExtractPaths, run_extract
from eagle3.phases.extract_disk import DiskSpaceError
from eagle3.phases.hs_files import scan_dir
from eagle3.phase_runner import done_marker, supervisor
from eagle3.process.services import LaunchSpec, Supervisor, state_dir_for
from tests.conftest import REPO
from tests.fakegpu import FakeGpuBackend
from tests.procutil import LISTEN, PY, SLEEP, wait_until
from tests.ports import free_port
from tests.reliability.conftest import fill
from tests.reliability.standins import (HERE, assert_nothing_left, eagle3_run_env, live, pythonpath_with, records,
                                        standin_config, write_extract_inputs)

pytestmark = pytest.mark.timeout(120)

EAGLE3 = str(Path(sys.executable).parent / "eagle3")

# A server stand-in: listens on its port and has a SIGTERM-deaf worker in its process group.
SERVER = """
import socket, subprocess, sys, time
deaf = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nprint('deaf', flush=True)\\n" \\
       "while True: time.sleep(1)"
w = subprocess.Popen([sys.executable, "-c", deaf])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("worker", w.pid, flush=True)
while True: time.sleep(1)
"""

# An orchestrator that launches that server through the pack's Supervisor, mid-phase, and is then SIGKILLed.
ORCHESTRATOR = """
import sys, time
from pathlib import Path
from eagle3.process.services import LaunchSpec, Supervisor
state, log, port, code = sys.argv[1:5]
sup = Supervisor(Path(state))
p = sup.launch(LaunchSpec(name="extract-vllm-server", argv=[sys.executable, "-c", code, port], log=Path(log),
                          phase="extract"))
print(p.pid, flush=True)
while True: time.sleep(1)
"""


# ---- SIGKILL of the orchestrator: the next run's handoff ends what it left -------------------------

def test_services_of_a_sigkilled_orchestrator_are_ended_by_the_next_handoff(make_config, tmp_path):
    port = free_port()
    cfg = make_config({"extract": {"server": {"port": port}}, "handoff": {"grace_s": 1, "deadline_s": 10}},
                      check_files=False)
    log = tmp_path / "server.log"
    orch = subprocess.Popen([PY, "-c", ORCHESTRATOR, str(state_dir_for(cfg.run_dir)), str(log), str(port), SERVER],
                            stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO)
    server = worker = None
    try:
        server = int(orch.stdout.readline())
        worker = int(wait_until(lambda: [l for l in log.read_text().splitlines() if l.startswith("worker ")],
                                timeout=30, what="the server's worker")[0].split()[1])
        wait_until(lambda: "deaf" in log.read_text().splitlines(), timeout=30, what="the worker to ignore SIGTERM")
        wait_until(lambda: procfs.listening_ports({port}), timeout=30, what="the server to listen")
        members = {pid: procfs.start_ticks(pid) for pid in (server, worker)}
        os.kill(orch.pid, signal.SIGKILL)  # no finally, no cleanup: the orchestrator is just gone
        assert orch.wait(timeout=10) == -signal.SIGKILL
        assert all(live(pid, t) for pid, t in members.items()), "its services outlive it (own session)"

        report = handoff_for_config(cfg, after="start")  # what the next `eagle3 run` does first

        assert report.ok, report.problems
        [svc] = report.services
        assert svc["name"] == "extract-vllm-server" and svc["clean"] and svc["pgid"] == server
        assert sorted(m["pid"] for m in svc["members"]) == sorted(members)
        assert svc["signal"] == "SIGKILL", "the SIGTERM-deaf worker needed the escalation"
        assert not any(live(pid, t) for pid, t in members.items())
        assert Supervisor(state_dir_for(cfg.run_dir)).registry.entries() == []
        assert not procfs.listening_ports({port})
        assert json.loads(Path(report.path).read_text())["services"][0]["name"] == "extract-vllm-server"
    finally:
        for pid in (server, worker):
            if pid and procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)
        if orch.poll() is None:
            orch.kill()
        orch.wait(timeout=10)
        orch.stdout.close()


# ---- servers that never become ready, or hang: killed within the budget, with the log tail ------

@pytest.mark.parametrize("mode,server,exc,says,tail", [
    ("never-200", {"startup_timeout_s": 3, "hang_timeout_s": 60}, ServiceStartTimeout, "not ready after 3 s",
     "engine core still initialising"),
    ("silent", {"startup_timeout_s": 60, "hang_timeout_s": 1.5}, ServiceHung, "hung during startup: no log output",
     "loading weights"),
], ids=["listens-never-200", "stops-logging"])
def test_server_never_ready_is_killed_within_its_budget(tmp_path, mode, server, exc, says, tail):
    rec = tmp_path / "argv.jsonl"
    cfg = standin_config(tmp_path, env={"STANDIN_MODE": mode, "STANDIN_RECORD": str(rec)},
                         overrides={"datagen": {"server": server}})
    sup = supervisor(cfg)
    t0 = time.monotonic()
    with pytest.raises(exc) as err:
        start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
    took = time.monotonic() - t0
    budget = min(server["startup_timeout_s"], server["hang_timeout_s"])
    # the budget, plus at most one 2 s HTTP probe, one 0.5 s poll and the stop grace (2 s)
    assert budget <= took < budget + 2 + 0.5 + 2 + 3, took
    [started] = records(rec)
    assert not procfs.group_members(started["pgid"]), "the whole server group is gone"
    assert says in str(err.value) and tail in err.value.log_tail and "--- log tail ---" in str(err.value)
    assert err.value.retryable, "a start that timed out may be retried"
    assert sup.registry.entries() == [] and not procfs.listening_ports({cfg.datagen.server.port})


# ---- the retry path through `eagle3 run`: retried once, then stopped by the repeated signature ----

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_start_timeout_is_retried_then_fails_with_the_log_tail_when_it_repeats(tmp_path, prefect_home):
    rec = tmp_path / "argv.jsonl"
    cfg = standin_config(tmp_path, env={"STANDIN_MODE": "never-200", "STANDIN_RECORD": str(rec)},
                         overrides={"datagen": {"server": {"startup_timeout_s": 3}}})
    res = subprocess.run([EAGLE3, "run", str(tmp_path / "config.yaml"), "--only", "datagen", "--no-doctor"],
                         env=eagle3_run_env(prefect_home), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=500, cwd=tmp_path)
    assert_nothing_left(prefect_home)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-4000:]
    # attempt 1 failed, was retried (the task allows 2 retries); attempt 2 failed the same way: stop there
    launches = records(rec)
    assert len(launches) == 2, f"expected 2 server launches (1 retry), got {len(launches)}"
    assert "retry 2 of phase datagen" in out
    assert "failed twice the same way" in out and "not retrying" in out
    history = json.loads((cfg.run_dir / "state" / "failures.json").read_text())["datagen"]
    assert len(history) == 2 and history[0]["signature"] == history[1]["signature"]
    assert history[0]["signature"].split(" ", 1)[1].startswith("ServiceStartTimeout|")
    # the final failure says what and carries the server's log tail
    final = res.stderr[res.stderr.index("error: pipeline standin ended FAILED"):]
    assert "datagen-vllm-server not ready after 3 s" in final and "--- log tail ---" in final
    assert "engine core still initialising" in final
    assert done_marker(cfg, "datagen") is None
    for launch in launches:
        assert not procfs.group_members(launch["pgid"])
    assert Supervisor(state_dir_for(cfg.run_dir)).registry.entries() == []


# ---- SIGTERM / SIGINT to `eagle3 run` -------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_eagle3_run_stops_its_services_and_exits_130(tmp_path, prefect_home, sig):
    cfg = standin_config(tmp_path)
    service_file = cfg.phase_dir("datagen") / "service.json"
    env = eagle3_run_env(prefect_home, "signal_phases:TABLE")
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        # SIGINT as a terminal leaves it: a job started in the background (`make test &`) inherits
        # SIGINT ignored, and Python, like any Unix program, keeps it ignored.
        cli = subprocess.Popen([EAGLE3, "run", str(tmp_path / "config.yaml"), "--no-doctor"], env=env,
                               stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True, cwd=tmp_path,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        wait_until(lambda: service_file.exists() or cli.poll() is not None, 400, "the phase to start its service",
                   step=0.1)
        assert cli.poll() is None, (tmp_path / "err.txt").read_text()[-3000:]
        service = json.loads(service_file.read_text())
        members = [(m["pid"], m["start_ticks"]) for m in service["members"]]
        assert all(live(*m) for m in members) and procfs.read_stat(members[0][0]).pgid != cli.pid

        os.kill(cli.pid, sig)  # to the CLI process only, by PID
        rc = cli.wait(timeout=90)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(timeout=10)
    stderr = (tmp_path / "err.txt").read_text()
    assert rc == 130, stderr[-3000:]
    assert "interrupted: stopping the services this pipeline started" in stderr
    assert not any(live(*m) for m in members), "a process of the service group survived"
    assert not procfs.group_members(service["pgid"])
    assert Supervisor(state_dir_for(cfg.run_dir)).registry.entries() == []
    assert done_marker(cfg, "datagen") is None
    assert_nothing_left(prefect_home)


# ---- a port taken before the server starts ----------------------------------------------------------

def test_port_taken_before_start_fails_before_launching_anything(tmp_path, spawner):
    rec = tmp_path / "argv.jsonl"
    cfg = standin_config(tmp_path, env={"STANDIN_RECORD": str(rec)})
    port = cfg.datagen.server.port
    stranger = spawner.start(LISTEN, port)
    sup = supervisor(cfg)
    with pytest.raises(PortBusy) as err:
        run_datagen(cfg, sup)  # the real phase: prompts, manifest check, then the server start
    msg = str(err.value)
    assert f"port {port}" in msg and "datagen.server.port" in msg and "already in use" in msg
    assert f"listened on by PID {stranger.pid} (" in msg, "the listener is named"
    assert not err.value.retryable
    assert records(rec) == [], "the engine was launched"
    assert sup.registry.entries() == []
    assert not (cfg.phase_dir("datagen") / "logs" / "vllm-server.log").exists()
    assert stranger.poll() is None and procfs.alive(stranger.pid), "the foreign listener is left alone"


# ---- a disk that fills up during extraction ----------------------------------------------------------

def test_disk_full_during_extraction_is_a_clear_error_and_no_partial_file_passes(tmp_path, small_disk):
    """Real phase code (run_extract) with stand-in engines, on a 2 MiB tmpfs that another job fills
    while hidden states are being written (where no tmpfs can be mounted: RLIMIT_FSIZE on the writer)."""
    control = tmp_path / "control"
    control.mkdir()
    rec = tmp_path / "argv.jsonl"
    env = {"STANDIN_RECORD": str(rec), "STANDIN_PAUSE_AFTER": "3"}
    env |= {"STANDIN_CONTROL": str(control)} if small_disk else {"STANDIN_FSIZE": "8192"}
    cfg = standin_config(tmp_path, env=env, run_dir=(small_disk or tmp_path) / "run")
    index, expect = write_extract_inputs(cfg, n=6, seq=20)
    paths = ExtractPaths.of(cfg)
    filler: list[Path] = []

    def another_job_fills_the_disk():
        if wait_until(lambda: (control / "paused").exists(), timeout=90, what="the writer to pause"):
            filler.append(fill(small_disk, leave_bytes=8192))  # room for a part of the next file only
        (control / "go").touch()

    job = threading.Thread(target=another_job_fills_the_disk) if small_disk else None
    if job:
        job.start()
    try:
        with pytest.raises(PipelineError) as err:
            run_extract(cfg, supervisor(cfg))
    finally:
        (control / "go").touch()
        if job:
            job.join(timeout=120)
    msg = str(err.value)
    if small_disk:
        assert isinstance(err.value, DiskSpaceError), msg
        assert "the disk filled up" in msg and str(paths.hidden_states) in msg and "free space" in msg
    else:
        assert isinstance(err.value, CommandFailed) and "File too large" in err.value.log_tail, msg
    assert not err.value.retryable, "retrying cannot free space"

    after = scan_dir(paths.hidden_states, index, expect)
    assert sorted(after.valid) == [0, 1, 2]
    assert list(after.invalid) == [3] and "truncated" in after.invalid[3], after.invalid
    assert (paths.hidden_states / "hs_3.safetensors").stat().st_size > 0, "a half-written file is there"
    assert not paths.manifest.exists() and not paths.summary.exists(), "nothing vouches for the set"
    assert not any(procfs.group_members(r["pgid"]) for r in records(rec)), "server and writer are stopped"

    for f in filler:
        f.unlink()  # space is freed; the rerun keeps the good files and redoes the half-written one
    kept = {i: (paths.hidden_states / f"hs_{i}.safetensors").stat().st_mtime_ns for i in (0, 1, 2)}
    summary = run_extract(cfg, supervisor(cfg))
    got = summary.details
    assert (got["samples"], got["kept_files"], got["redone_files"], got["new_files"]) == (6, 3, 1, 3)
    final = scan_dir(paths.hidden_states, index, expect)
    assert sorted(final.valid) == list(range(6)) and not final.invalid
    assert {i: (paths.hidden_states / f"hs_{i}.safetensors").stat().st_mtime_ns for i in (0, 1, 2)} == kept
    assert paths.manifest.exists()
    assert supervisor(cfg).registry.entries() == [], "the rerun dropped what the full disk kept it from dropping"


def test_launch_on_a_full_disk_leaves_no_unrecorded_process(tmp_path, small_disk):
    if small_disk is None:
        pytest.skip("needs a small tmpfs (mount as root)")
    sup = Supervisor(small_disk / "state")  # the owner token is written while there is room
    fill(small_disk)
    marker = f"reliability-{uuid.uuid4().hex}"
    with pytest.raises(OSError) as err:
        sup.launch(LaunchSpec(name="svc", argv=[PY, "-c", SLEEP, marker], log=tmp_path / "svc.log"))
    assert err.value.errno == errno.ENOSPC
    assert "launching svc" in (tmp_path / "svc.log").read_text(), "it was started before the registry write failed"
    left = [p.pid for p in procfs.all_procs() if not p.zombie and marker in procfs.cmdline(p.pid)]
    assert not left, f"a process that no registry records outlived the failed launch: {left}"


# ---- the handoff and a protected daemon ---------------------------------------------------------

@pytest.mark.parametrize("mib", [0, 512], ids=["idle-daemon", "daemon-holding-memory"])
def test_protected_daemon_by_executable_name_is_never_signalled(tmp_path, mib):
    """A copy of `sleep` whose executable is named nvidia-persistenced (its argv[0] says something
    else) holds a GPU device file: reported as protected, never signalled, also when it blocks."""
    fake = FakeGpuBackend(tmp_path / "dev", count=1, mib_per_holder=mib)
    exe = tmp_path / "sbin" / "nvidia-persistenced"
    exe.parent.mkdir()
    shutil.copy2(shutil.which("sleep"), exe)
    with open(fake.device(0), "rb") as device:
        daemon = subprocess.Popen(["daemon-standin", "600"], executable=str(exe), stdin=device,
                                  start_new_session=True)
    ticks = procfs.start_ticks(daemon.pid)
    try:
        wait_until(lambda: fake.snapshot()[0].processes, what="the daemon to hold the device")
        assert procfs.cmdline(daemon.pid)[0] == "daemon-standin" and procfs.exe_name(daemon.pid) == exe.name
        settings = Handoff(grace_s=0.5, deadline_s=2, poll_interval_s=0.05, shm_dir=tmp_path, dev_dir=fake.dev_dir)
        sup = Supervisor(state_dir_for(tmp_path / "run"))
        if mib:
            with pytest.raises(HandoffError) as err:
                run_handoff(tmp_path / "run", settings, [0], backend=fake, supervisor=sup)
            report = err.value.report
            assert f"{mib} MiB used" in str(err.value) and f"PID {daemon.pid}" in str(err.value)
        else:
            report = run_handoff(tmp_path / "run", settings, [0], backend=fake, supervisor=sup)
            assert report.ok
        [holder] = report.holders
        assert holder["pid"] == daemon.pid and holder["class"] == "protected"
        assert "nvidia-persistenced" in holder["why"]
        assert report.ended == [] and live(daemon.pid, ticks), "the daemon was signalled"
    finally:
        if live(daemon.pid, ticks):
            daemon.kill()
        daemon.wait(timeout=10)


# ---- /dev/shm: a live multiprocessing semaphore is kept ------------------------------------------

SEMAPHORE = """
import multiprocessing as mp, time
sem = mp.get_context("spawn").Semaphore(1)  # spawn context: the named semaphore stays linked while used
print("ready", sem._semlock.name, flush=True)
while True: time.sleep(1)
"""


def test_live_multiprocessing_semaphore_in_dev_shm_is_kept(spawner):
    """glibc maps a new semaphore under a temporary name (sem.XXXXXX, then linked to sem.mp-...), so a
    match by path would call it unused; the purge matches inodes. Runs on the real /dev/shm, restricted
    to this test's own two names (other sessions' files there are not this test's to touch)."""
    holder = spawner.start(SEMAPHORE, ready=False)
    line = holder.stdout.readline().split()
    assert line[0] == "ready", line
    live_name = "sem." + line[1].lstrip("/")
    maps = Path(f"/proc/{holder.pid}/maps").read_text()
    assert f"/dev/shm/{live_name}" not in maps and "/dev/shm/sem." in maps, "mapped under another name"
    stale_name = f"sem.mp-reliability-{uuid.uuid4().hex[:8]}"
    stale = Path("/dev/shm") / stale_name
    stale.write_bytes(b"\0" * 32)  # a semaphore file nobody maps any more
    try:
        result = shm.purge(Path("/dev/shm"), patterns=(live_name, stale_name))
    finally:
        stale.unlink(missing_ok=True)
    assert result.removed == [stale_name]
    kept = {k["name"]: k["reason"] for k in result.kept}
    assert kept == {live_name: f"open or mapped by PID {holder.pid}"}
    assert (Path("/dev/shm") / live_name).exists() and holder.poll() is None
