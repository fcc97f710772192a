"""The single-phase commands (`eagle3 datagen|extract|train|bench`) with the stand-in engine: what a
user sees off a terminal, and server flags chosen from what the installed vLLM itself says.

Issue 22 found both on the GPU machine: `eagle3 bench` printed one progress bar in five minutes into
a file, and `eagle3 extract` passed vLLM 0.25 a flag only 0.32 has (`--enable-scale-out`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3.engines.probe import engine_accepts
from eagle3.phases.extract import ExtractPaths, run_extract
from eagle3.phase_runner import supervisor
from tests.reliability.standins import records, standin_config, write_extract_inputs

pytestmark = pytest.mark.timeout(120)

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
FIXTURE_DRAFTER = Path(__file__).resolve().parents[1] / "fixtures" / "eagle3-tiny" / "drafter-trained"
STAMPED = re.compile(r"^\d\d:\d\d:\d\d (\w+): (.*)$")


@pytest.mark.parametrize("command", ["datagen", "extract", "bench"])
def test_a_phase_command_off_a_terminal_prints_lines_and_heartbeats(tmp_path, command):
    """stderr is a file: every step is a line at once, and a wait (a server that never becomes ready,
    8 s) is never silent for longer than the interval (1 s here, 30 s by default)."""
    server = {"server": {"startup_timeout_s": 8, "hang_timeout_s": 60}}
    overrides = {"datagen": server, "extract": server, "bench": dict(server)}
    if command == "bench":  # a drafter of its own (one vLLM loads: it is gated before any server)
        overrides["bench"].update(drafter=str(FIXTURE_DRAFTER), drafter_trained=False)
    cfg = standin_config(tmp_path, env={"STANDIN_MODE": "never-200"}, overrides=overrides)
    if command == "extract":
        write_extract_inputs(cfg)
    err_file = tmp_path / "stderr.txt"
    with open(err_file, "w") as err:
        t0 = time.monotonic()
        res = subprocess.run([EAGLE3, command, str(tmp_path / "config.yaml")], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=err, text=True, timeout=100, cwd=tmp_path,
                             env={**os.environ, "EAGLE3_PROGRESS_INTERVAL_S": "1"})
        took = time.monotonic() - t0
    text = err_file.read_text()
    assert res.returncode == 1, text[-3000:]
    assert "not ready after 8 s" in text
    ours = [m.groups() for line in text.splitlines() if (m := STAMPED.match(line))]
    assert ("run", f"{command} alone (`eagle3 {command}`)") in ours, text[-3000:]
    # one heartbeat per second of the 8 s wait, give or take the start and the probe's own timeout
    heartbeats = [msg for phase, msg in ours if phase == command and ("waiting" in msg or "waited" in msg)]
    assert len(heartbeats) >= 4, (heartbeats, text[-3000:])
    assert "\x1b[" not in text, "no terminal control codes in a file"
    assert took < 60


@pytest.mark.parametrize("release,passed", [("0.32", True), ("0.25", False)])
def test_extract_passes_enable_scale_out_only_to_a_vllm_whose_parser_has_it(tmp_path, release, passed):
    """The stand-in's parser has the flags of the release named; its server exits 2 on a flag that
    release lacks, as vLLM 0.25's did on the GPU machine. The pack asks the parser once per run dir."""
    rec = tmp_path / "argv.jsonl"
    cfg = standin_config(tmp_path, env={"STANDIN_VLLM_RELEASE": release, "STANDIN_RECORD": str(rec)})
    write_extract_inputs(cfg, n=3)
    sup = supervisor(cfg)
    assert engine_accepts(cfg, sup, "vllm", "--enable-scale-out") is passed
    summary = run_extract(cfg, sup)
    assert summary.details["new_files"] == 3
    [server] = [r for r in records(rec) if r["argv"][1:2] == ["serve"]]
    assert ("--enable-scale-out" in server["argv"]) is passed
    assert len(list(ExtractPaths.of(cfg).hidden_states.glob("hs_*.safetensors"))) == 3
    # the answer is cached in the run dir: a second question starts no probe
    assert engine_accepts(cfg, sup, "vllm", "--enable-scale-out") is passed
    assert len([r for r in records(rec) if r["argv"][1:2] == ["serve"]]) == 1
