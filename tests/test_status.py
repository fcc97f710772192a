"""`eagle3 status` (the real command, from another process) on a run recorded by eagle3.run.record:
in progress with a stand-in service launched through the Supervisor, failed, killed, and --watch."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.appendlog import AppendLog
from eagle3.layout import RunLayout

from eagle3.process import lease
from eagle3 import progress
from eagle3.phase_table import PIPELINE
from eagle3.errors import GateError
from eagle3.phase_runner import supervisor
from eagle3.progress import END, PROGRESS, START, Event
from eagle3.run.record import recording, run_file
from eagle3.process.services import LaunchSpec, Supervisor, state_dir_for
from tests.procutil import PY, SLEEP

EAGLE3 = str(Path(sys.executable).parent / "eagle3")


def status(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EAGLE3, "status", *map(str, args)], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def row(out: str, key: str) -> str:
    """The value of the `key` row of the status lines."""
    found = [line[len(key):].strip() for line in out.splitlines() if line.startswith(key + " ")]
    assert len(found) == 1, f"no single {key!r} row in:\n{out}"
    return found[0]


def status_json(target) -> dict:
    res = status(target, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_a_run_in_progress_then_failed(tmp_path, make_config):
    cfg = make_config(check_files=False)
    config = tmp_path / "config.yaml"
    sup = supervisor(cfg)
    now = time.time()
    proc = None
    start = {"phase": "datagen", "engine": "vllm", "seconds": 86.4, "steps": {"weights_s": 0.12, "engine_init_s": 49.91}}
    with AppendLog(cfg.layout.server_starts) as starts:  # a start of an earlier run in this run dir
        starts.append({**start, "name": "earlier-vllm-server", "at": now - 3600})
    with pytest.raises(GateError):
        with lease.hold(cfg.run_dir), recording(cfg, str(config), [p.name for p in PIPELINE]) as sink:
            progress.emit(Event("datagen", START, at=now - 30))
            progress.emit(Event("datagen", PROGRESS, done=10, total=64, unit="samples", at=now - 10))
            progress.emit(Event("datagen", PROGRESS, done=30, total=64, unit="samples", detail={"tok_s": 99.5},
                                at=now))  # 2 samples/s: ETA 17 s, counting down from here
            sink.flush()
            with AppendLog(cfg.layout.server_starts) as starts:
                starts.append({**start, "name": "datagen-vllm-server", "at": time.time()})
            proc = sup.launch(LaunchSpec(name="datagen-vllm-server", argv=[PY, "-c", SLEEP], phase="datagen",
                                         log=cfg.phase_dir("datagen") / "logs" / "server.log"))
            try:
                text = status(config)
                assert text.returncode == 0, text.stderr
                out = text.stdout
                assert row(out, "state").startswith("RUNNING for ")
                assert row(out, "held by").startswith(f"PID {os.getpid()} (")
                assert row(out, "service").startswith(f"datagen-vllm-server PID {proc.pid} alive, GPUs -, up ")
                assert row(out, "server start") == \
                    "datagen-vllm-server: ready in 86.4 s (weights 0.1 s, engine init 49.9 s, by its log)"
                assert "earlier-vllm-server" not in out, "a start of an earlier run is not this run's"
                assert re.fullmatch(r"datagen \(1 of 4\), running for 3\d s, ETA 1[0-7] s", row(out, "phase"))
                assert re.fullmatch(r"30/64 samples \(47%\), 2.00 samples/s, ETA 1[0-7] s; 99.5 tok/s", row(out, "datagen"))
                s = status_json(cfg.run_dir)  # a run dir works as well as the config
                assert s["status"] == "running" and s["current_phase"] == "datagen"
                assert 8 < s["eta_s"] <= 17
                assert [(v["name"], v["pid"], v["state"]) for v in s["services"]] == \
                       [("datagen-vllm-server", proc.pid, "alive")]
                assert s["config_path"] == str(config) and "resume" not in out
            finally:
                proc.stop(1)
            progress.emit(Event("datagen", END, ok=False, message="GateError: 9 of 64 prompts have no sample"))
            raise GateError("9 of 64 prompts have no sample")
    out = status(cfg.run_dir).stdout
    assert row(out, "state").startswith("FAILED ")
    assert row(out, "error") == "datagen: GateError: 9 of 64 prompts have no sample"
    assert row(out, "resume") == f"eagle3 run {config}   (finished phases are skipped)"
    assert row(out, "datagen").startswith("FAILED in ")
    s = status_json(config)
    assert (s["status"], s["failed_phase"], s["services"], s["lease"]) == ("failed", "datagen", [], None)


def test_the_services_of_a_fanned_out_phases_shards_are_listed_with_their_shard(tmp_path, make_config):
    """A shard is a run dir of its own (shards/<phase>/<i>-of-<n>/, i from 1): its server is registered there, not
    in the run's registry, and `eagle3 status` of the run lists it."""
    cfg = make_config(check_files=False)
    config = tmp_path / "config.yaml"  # not yet run: the config names the run dir
    shard_sup = Supervisor(state_dir_for(cfg.layout.shard_run_dir("extract", 1, 2)))
    proc = shard_sup.launch(LaunchSpec(name="extract-vllm-server", argv=[PY, "-c", SLEEP], phase="extract",
                                       log=cfg.layout.shard_run_dir("extract", 1, 2) / "extract" / "logs" / "s.log"))
    try:
        out = status(config).stdout
        assert row(out, "service").startswith(f"extract shard 2/2: extract-vllm-server PID {proc.pid} alive, ")
        [svc] = status_json(config)["services"]
        assert (svc["shard"], svc["pid"], svc["state"]) == ("extract shard 2/2", proc.pid, "alive")
    finally:
        proc.stop(1)
    assert row(status(config).stdout, "services") == "none registered"  # a stop unregisters the shard's server


def test_each_shards_server_starts_are_shown_with_their_shard(tmp_path, make_config):
    """Each shard writes its own server-starts.jsonl in its run dir; status shows them as it shows the run's."""
    cfg = make_config(check_files=False)
    config = tmp_path / "config.yaml"
    for index, seconds in ((0, 31.5), (1, 12.0)):
        log = RunLayout(cfg.layout.shard_run_dir("datagen", index, 2)).server_starts
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(json.dumps({"phase": "datagen", "name": "datagen-vllm-server", "engine": "vllm",
                                   "seconds": seconds, "steps": {"compile_s": 3.5}, "at": 100.0 + index}) + "\n")
    lines = [line for line in status(config).stdout.splitlines() if line.strip().startswith("server start")]
    assert [re.sub(r"^\s*server start\s+", "", line) for line in lines] == [
        "datagen shard 1/2: datagen-vllm-server: ready in 31.5 s (compile 3.5 s, by its log)",
        "datagen shard 2/2: datagen-vllm-server: ready in 12.0 s (compile 3.5 s, by its log)"]
    assert [s["shard"] for s in status_json(config)["server_starts"]] == ["datagen shard 1/2", "datagen shard 2/2"]


def test_a_shards_service_on_another_host_is_named_with_its_host_not_probed(tmp_path, make_config, monkeypatch):
    """The shard's lease says which host runs it: `eagle3 status` on this host names that host and does
    not read that PID in its own /proc (a PID there means nothing here)."""
    import socket

    cfg = make_config(check_files=False)
    config = tmp_path / "config.yaml"
    shard_dir = cfg.layout.shard_run_dir("extract", 0, 2)
    proc = Supervisor(state_dir_for(shard_dir)).launch(LaunchSpec(name="extract-vllm-server", argv=[PY, "-c", SLEEP],
                                                                  phase="extract", log=shard_dir / "s.log"))
    try:
        monkeypatch.setattr(socket, "gethostname", lambda: "node-b")  # the lease is written as node-b's
        with lease.hold(shard_dir):
            monkeypatch.undo()
            [svc] = status_json(config)["services"]
        assert (svc["shard"], svc["pid"], svc["state"]) == ("extract shard 1/2", proc.pid,
                                                            "on host node-b (not checked from here)")
    finally:
        proc.stop(1)


def test_a_preflight_refusal_names_the_step_and_its_first_cause(tmp_path, make_config):
    """The doctor refused (what a run dir on a 9 MiB filesystem gives): status names the preflight
    step and the first failed check, not "error ?: DoctorFailed: preflight failed:"."""
    from eagle3.doctor import FAIL, PASS, Check, DoctorFailed

    cfg = make_config(check_files=False)
    checks = [Check("gpus", PASS, "none declared"),
              Check("disk", FAIL, "neither hidden-state mode fits: offline needs 13 MB, online 4 MB, 9 MB free",
                    "free disk under run_dir"),
              Check("port 8100", FAIL, "in use by PID 1", "stop it or change datagen.server.port")]
    with pytest.raises(DoctorFailed):
        with lease.hold(cfg.run_dir), recording(cfg, str(tmp_path / "config.yaml"), [p.name for p in PIPELINE]):
            progress.emit(Event("preflight", START, message="doctor"))
            raise DoctorFailed(checks)
    s = status_json(cfg.run_dir)
    assert (s["status"], s["failed_phase"]) == ("failed", "preflight")
    assert s["error"] == ("DoctorFailed: preflight failed: disk: neither hidden-state mode fits: offline needs 13 MB, "
                          "online 4 MB, 9 MB free; fix: free disk under run_dir (and 1 more failed check(s), each "
                          "logged with its fix)")
    out = status(cfg.run_dir).stdout
    assert row(out, "error").startswith("preflight: DoctorFailed: preflight failed: disk: neither")


@pytest.mark.parametrize("exc, name", [(KeyboardInterrupt("signal 15"), "SIGTERM"), (KeyboardInterrupt(), "SIGINT")])
def test_a_run_stopped_by_a_signal_is_interrupted_not_failed(tmp_path, make_config, exc, name):
    cfg = make_config(check_files=False)
    with pytest.raises(KeyboardInterrupt):
        with lease.hold(cfg.run_dir), recording(cfg, str(tmp_path / "config.yaml"), [p.name for p in PIPELINE]):
            progress.emit(Event("datagen", START))
            raise exc
    s = status_json(cfg.run_dir)
    assert (s["status"], s["signal"], s["failed_phase"]) == ("interrupted", name, "datagen")
    out = status(cfg.run_dir).stdout
    assert row(out, "state").startswith(f"INTERRUPTED by {name} during datagen") and "FAILED" not in out
    assert row(out, "resume").startswith("eagle3 run ")


def test_prefects_termination_signal_reads_as_interrupted():
    """Inside a flow run Prefect raises its own TerminationSignal (a BaseException with .signal)."""
    import signal

    from prefect.exceptions import TerminationSignal

    from eagle3.progress import interrupting_signal

    assert interrupting_signal(TerminationSignal(signal.SIGTERM)) == "SIGTERM"
    assert interrupting_signal(GateError("no")) is None and interrupting_signal(SystemExit(1)) is None


def test_a_run_whose_process_was_killed_is_reported_dead(tmp_path, make_config):
    cfg = make_config(check_files=False)
    gone = subprocess.run([PY, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    run_file(cfg.run_dir).parent.mkdir(parents=True)
    run_file(cfg.run_dir).write_text(json.dumps({
        "name": cfg.name, "config_path": str(tmp_path / "config.yaml"), "phases": [p.name for p in PIPELINE], "status": "running",
        "pid": int(gone.stdout), "start_ticks": 1, "started_at": time.time() - 60,
        "resume": f"eagle3 run {tmp_path / 'config.yaml'}"}))
    out = status(cfg.run_dir).stdout
    assert row(out, "state").startswith("DIED: PID ") and "without recording an outcome" in out
    assert row(out, "resume").startswith(f"eagle3 run {tmp_path / 'config.yaml'}")


def test_bad_targets_exit_2_naming_them(tmp_path):
    res = status(tmp_path / "missing.yaml")
    assert res.returncode == 2 and "missing.yaml: no such config file or run dir" in res.stderr
    res = status(tmp_path)
    assert res.returncode == 2 and "not a run dir of this pack" in res.stderr


def test_watch_redraws_until_the_run_ends(tmp_path, make_config):
    cfg = make_config(check_files=False)
    with recording(cfg, str(tmp_path / "config.yaml"), ["bench"]):
        progress.emit(Event("bench", START))
        progress.emit(Event("bench", PROGRESS, done=1, total=6, unit="windows"))
        watcher = subprocess.Popen([EAGLE3, "status", str(cfg.run_dir), "--watch", "--every", "0.3", "--json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # the command's own start-up (imports) takes ~1-2 s here
        assert watcher.poll() is None, watcher.communicate()
    out, err = watcher.communicate(timeout=30)
    frames = [json.loads(line) for line in out.splitlines()]
    assert watcher.returncode == 0, err
    assert frames[0]["status"] == "running" and frames[-1]["status"] == "completed" and len(frames) >= 2
    assert frames[-1]["resume"] == f"eagle3 run {tmp_path / 'config.yaml'} --only bench"
