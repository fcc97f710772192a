"""`eagle3 run` without a terminal prints progress for every phase, never going quiet for longer than
the interval (here EAGLE3_PROGRESS_INTERVAL_S=2 instead of the default 30 s), and `eagle3 status`
from another process shows the running phase, its progress and ETA and the PID of the service it
launched through the Supervisor; after a failed run it shows the command that resumes it.

The phases are the stand-ins of noop_phases.py (progress ticks, a silent stretch, a `sleep` service);
the flow, its tasks, handoffs and the Prefect server are real."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from flowkit import PHASES
from noop_phases import overrides_env, write_noop_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
INTERVAL_S = 2.0
OUR_LINE = re.compile(r"^\d\d:\d\d:\d\d (\w+): (.*)$")  # Prefect's own log lines carry milliseconds and a '|'


class Run:
    """`eagle3 run` in the background; every stderr line with the monotonic time it arrived."""

    def __init__(self, config: Path, env: dict):
        # SIGINT as on a terminal: a suite started in the background (`make test &`) passes it on ignored.
        self.proc = subprocess.Popen([EAGLE3, "run", str(config), "--no-doctor"], env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        self.lines: list[tuple[float, str]] = []
        self.stdout = ""
        self._threads = [threading.Thread(target=self._read_err, daemon=True),
                         threading.Thread(target=self._read_out, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _read_out(self) -> None:
        self.stdout = self.proc.stdout.read()

    def wait(self, timeout: float = 300) -> int:
        rc = self.proc.wait(timeout)
        for t in self._threads:
            t.join(10)
        return rc

    def ours(self) -> list[tuple[float, str, str]]:
        return [(t, m.group(1), m.group(2)) for t, line in self.lines if (m := OUR_LINE.match(line))]


def status_json(target: Path, env: dict) -> dict:
    res = subprocess.run([EAGLE3, "status", str(target), "--json"], env=env, capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_progress_lines_and_status_of_a_run(prefect_server, tmp_path):
    knobs = {"ticks": {"datagen": [8, 0.5], "extract": [20, 0.5], "train": [8, 0.5], "bench": [8, 0.5]},
             "sleep": {"train": 3.5},  # a stretch without any progress: only the heartbeat speaks
             "service": ["extract"]}
    config = write_noop_config(tmp_path / "cfg", name="progress-run", knobs=knobs)
    env = prefect_server.env | overrides_env() | {"EAGLE3_PROGRESS_INTERVAL_S": str(INTERVAL_S)}
    run = Run(config, env)
    seen = None
    try:
        deadline = time.monotonic() + 240
        while seen is None and run.proc.poll() is None and time.monotonic() < deadline:
            s = status_json(config, env)
            svc = [v for v in s["services"] if v["name"] == "extract-standin-server"]
            view = s["phases"]["extract"]["view"] or {}
            if s["current_phase"] == "extract" and svc and (view.get("done") or 0) >= 2 and s["eta_s"] is not None:
                seen = (s, svc[0])
            else:
                time.sleep(0.5)
        rc = run.wait()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.wait(30)
    assert rc == 0, "\n".join(line for _, line in run.lines[-40:])

    # status, mid-extraction, from another process
    assert seen is not None, "eagle3 status never showed the extraction with its service and an ETA"
    s, svc = seen
    started = json.loads((tmp_path / "cfg" / "run" / "extract" / "service.json").read_text())
    assert s["status"] == "running" and svc["pid"] == started["pid"] and svc["state"] == "alive"
    assert re.match(r"\d+/20 items \(\d+%\), [\d.]+ items/s, ETA \d+ s", s["phases"]["extract"]["line"]), s["phases"]
    assert s["phases"]["datagen"]["done"] and s["last_handoff"]["label"] == "datagen-to-extract"
    assert status_json(config, env)["status"] == "completed"

    ours = run.ours()
    for phase in PHASES:
        counted = [text for _, p, text in ours if p == phase and re.match(r"\d+/8|\d+/20", text)]
        assert counted, f"no progress line with counts for {phase}:\n" + "\n".join(t for _, _, t in ours)
        assert any(text.startswith("done in ") for _, p, text in ours if p == phase)
    assert any(p == "train" and "no progress reported yet" in text for _, p, text in ours)
    # one line per handoff: the recovery before the flow, the start one, one after each phase
    assert sum(1 for _, p, text in ours if p == "handoff") == len(PHASES) + 2
    gaps = [(b[0] - a[0], a[2], b[2], a[0]) for a, b in zip(ours, ours[1:])]
    worst = max(gaps)
    # Every stderr line of the silent stretch with its arrival, Prefect's own (millisecond stamps) too: what a
    # failure needs to tell the run going quiet from the whole box stalling (6.2 s once, in a loaded CI run).
    start = worst[3]
    stretch = "\n".join(f"+{t - start:6.2f} s {line}" for t, line in run.lines if start <= t <= start + worst[0])
    assert worst[0] <= INTERVAL_S + 1.5, f"silent for {worst[0]:.1f} s between {worst[1]!r} and {worst[2]!r}:\n{stretch}"
    # With `eagle3 run` on a pipe, the flow's log must not repeat the lines the CLI already printed.
    assert not [line for _, line in run.lines if " | " in line and re.search(r" - (datagen|extract): \d+/", line)]


def test_status_after_a_failed_run_gives_the_resume_command(prefect_server, tmp_path):
    config = write_noop_config(tmp_path / "cfg", name="progress-fail", knobs={"fail_once": {"extract": "gate"}})
    env = prefect_server.env | overrides_env() | {"EAGLE3_PROGRESS_INTERVAL_S": str(INTERVAL_S)}
    run = Run(config, env)
    assert run.wait() == 1
    assert any(p == "extract" and text.startswith("FAILED in ") and "gate failed on purpose" in text
               for _, p, text in run.ours())
    s = status_json(tmp_path / "cfg" / "run", env)
    assert (s["status"], s["failed_phase"]) == ("failed", "extract")
    assert "GateError: extract: gate failed on purpose" in s["error"]
    assert s["resume"] == f"eagle3 run {config}"
    assert s["phases"]["datagen"]["done"] and not s["phases"]["extract"]["done"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_status_after_a_signal_shows_interrupted_with_the_resume_command(prefect_server, tmp_path, sig):
    """Preemption (Slurm, kubelet) sends SIGTERM; Ctrl-C is SIGINT: the run unwinds, and its status is
    INTERRUPTED in the phase it was in, with the command that resumes it, never FAILED."""
    config = write_noop_config(tmp_path / "cfg", name=f"progress-{sig.name.lower()}",
                               knobs={"ticks": {"extract": [200, 0.25]}})
    env = prefect_server.env | overrides_env() | {"EAGLE3_PROGRESS_INTERVAL_S": str(INTERVAL_S)}
    run = Run(config, env)
    deadline = time.monotonic() + 240
    while not any(p == "extract" and re.match(r"\d+/200", text) for _, p, text in run.ours()):
        assert run.proc.poll() is None and time.monotonic() < deadline, "\n".join(line for _, line in run.lines)
        time.sleep(0.2)
    run.proc.send_signal(sig)
    rc = run.wait()
    assert rc != 0
    s = status_json(tmp_path / "cfg" / "run", env)
    assert (s["status"], s["signal"], s["failed_phase"]) == ("interrupted", sig.name, "extract")
    assert s["resume"] == f"eagle3 run {config}"
    assert s["phases"]["datagen"]["done"] and not s["phases"]["extract"]["done"]
    text = subprocess.run([EAGLE3, "status", str(tmp_path / "cfg" / "run")], env=env, capture_output=True,
                          text=True, timeout=60).stdout
    assert f"INTERRUPTED by {sig.name} during extract" in text and "FAILED" not in text
    assert any(p == "extract" and t.startswith("INTERRUPTED in ") and t.endswith(f"interrupted by {sig.name}")
               for _, p, t in run.ours()), "the phase's own line says interrupted, not FAILED"
    assert f"eagle3 run {config}" in text


def test_a_worker_run_logs_the_progress_lines_in_its_flow_run_log(worker, tmp_path):
    """Without a terminal or a CLI (a deployment run by a worker), the same lines go into the flow
    run's log on the server, once each; `eagle3 status` reads the run's outcome from its run dir."""
    from flowkit import PIPELINE, client, config, params, submit, wait_final
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    path, run_dir = config(tmp_path, "progress-worker", {"ticks": {"datagen": [4, 0.2]}})
    rid = submit(PIPELINE, params(path))
    run = wait_final([rid], timeout=300)[rid]
    assert run.state.is_completed(), run.state

    def messages() -> list[str]:
        with client() as c:
            return [log.message for log in c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[rid])))]

    handoffs = len(PHASES) + 1  # start + after each
    # Logs are shipped to the server in batches: wait for the run's last line (the handoff after bench,
    # which comes after "bench: done"; a fresh clone's run once read the log between the two).
    deadline = time.monotonic() + 30
    while sum(1 for m in messages() if m.startswith("handoff: done in ")) < handoffs and time.monotonic() < deadline:
        time.sleep(1)
    logged = messages()
    for phase in PHASES:
        assert sum(1 for m in logged if m == f"{phase}: started") == 1, logged
        assert sum(1 for m in logged if m.startswith(f"{phase}: done in ")) == 1, logged
    assert sum(1 for m in logged if m.startswith("handoff: done in ")) == handoffs, logged
    s = status_json(run_dir, worker_env())
    assert s["status"] == "completed" and s["command"] and all(s["phases"][p]["done"] for p in PHASES)


def worker_env() -> dict:
    """The worker's view: no Prefect settings of the session, the no-op phase table it runs."""
    import os

    from noop_phases import overrides_env

    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | overrides_env()
