"""Online hidden states on CPU, end to end with the real parts: `auto` decides online from the real
prepared data and a disk that cannot hold the offline cache; the train phase runs the real vLLM
CPU server in extract_hidden_states mode beside speculators. How far a CPU allows: every sample
goes through speculators' own on-demand data path (ArrowDataset, on_missing="generate", its
FileTransfer: request, the server's file, load, check, delete), then `speculators train
--dry-run` (the trainer proper needs an accelerator: tests/gpu/ covers it). `eagle3 train` is
killed with SIGKILL mid-step; the rerun's recovery handoff ends both services and it completes.
Three server starts in all (prepare-data, the killed step, the rerun)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from eagle3.phases import hs_mode
from eagle3.process import procfs
from eagle3.phases.extract import ExtractPaths
from eagle3.phases.extract_disk import HEADER_BYTES
from eagle3.phases.extract_manifest import read_extract_manifest, resolve_layer_plan
from eagle3.phase_runner import run_phase, supervisor
from eagle3.process.services import LaunchSpec, Supervisor

from tests.phases.test_extract import EAGLE3, extract_config, write_phase1  # noqa: F401 (fixture)

CACHE_BOUND = 400_000  # bytes: above one tiny sample (~150 KB), far below the offline estimate


def _alive(pid: int) -> bool:
    return procfs.read_stat(pid) is not None


@pytest.mark.slow
@pytest.mark.engine
def test_online_step_auto_chosen_bounded_killed_and_resumed(extract_config, tmp_path, monkeypatch):
    cfg = extract_config({"concurrency": 1}, top={"hidden_states": {"cache_max_bytes": CACHE_BOUND}})
    write_phase1(cfg, 12)
    config_file = tmp_path / "config.yaml"
    # The run dir's disk as seen by `auto`: 600 KB free, 540 KB usable with the 10 % margin.
    monkeypatch.setattr(hs_mode, "free_bytes", lambda run_dir: (600_000, Path(run_dir)))

    sup = supervisor(cfg)
    try:
        summary = run_phase(cfg, "extract", sup).summary  # `eagle3 train` checks it is done
    finally:
        sup.stop_all()
    monkeypatch.undo()
    manifest = read_extract_manifest(cfg)
    decision = manifest.decision
    assert summary["details"]["mode"] == manifest.mode == decision["mode"] == "online" and decision["requested"] == "auto"
    assert decision["offline_bytes"] > decision["usable_bytes"] == 540_000 >= CACHE_BOUND == decision["cache_bound"]
    assert not ExtractPaths.of(cfg).hidden_states.exists()  # nothing written offline
    assert manifest.layer_ids == list(resolve_layer_plan(cfg).layer_ids) and manifest.layer_id_convention == "vllm"

    # Run 1: `eagle3 train`, SIGKILLed once the server and a second service of the step are running.
    test_sup = Supervisor(tmp_path / "test-state")
    cli = test_sup.launch(LaunchSpec(name="eagle3-train", argv=[str(EAGLE3), "train", str(config_file)],
                                     log=tmp_path / "train1.log"))
    registry = Supervisor(cfg.layout.state).registry
    try:
        deadline = time.monotonic() + 600
        while len({e.name for e in registry.entries() if e.phase == "train"}) < 2:
            assert cli.poll() is None, f"eagle3 train exited early:\n{cli.log_tail()}"
            assert time.monotonic() < deadline, f"the step's services never ran together:\n{cli.log_tail()}"
            time.sleep(0.05)
        os.kill(cli.pid, signal.SIGKILL)
        cli.popen.wait(timeout=10)
    finally:
        cli.stop()
    orphans = {e.name: e.pid for e in registry.entries()}
    assert "train-vllm-server" in orphans and len(orphans) >= 2, orphans
    assert all(_alive(pid) for pid in orphans.values())  # the orchestrator's death ended none of them

    # Run 2: its recovery handoff ends both services and empties the cache; the step then completes.
    cli = test_sup.launch(LaunchSpec(name="eagle3-train", argv=[str(EAGLE3), "train", str(config_file)],
                                     log=tmp_path / "train2.log"))
    try:
        rc = cli.wait(timeout_s=900)
    finally:
        cli.stop()
    assert rc == 0, (tmp_path / "train2.log").read_text()[-3000:]
    assert not any(_alive(pid) for pid in orphans.values())
    recovery = [json.loads(p.read_text()) for p in sorted((cfg.run_dir / "handoffs").glob("*recovery*.json"))]
    ended = {s["name"] for r in recovery for s in r["services"] if s["members"]}
    assert set(orphans) <= ended, (ended, orphans)
    assert registry.entries() == [] and not procfs.listening_ports({cfg.extract.server.port})

    train = json.loads((cfg.run_dir / "train" / "manifest.json").read_text())
    assert train["hidden_states_mode"] == "online" and train["trained"] is False
    assert train["aux_layer_ids_vllm"] == manifest.target_layer_ids  # recorded as an offline run records them
    online = train["online"]
    assert online["fetched_samples"] == manifest.num_samples and online["exceeded"] is None
    assert online["sampled_peak_bytes"] <= CACHE_BOUND  # sampled: a file may live less than one look
    assert not cfg.layout.hs_cache.exists()  # purged after the step

    # The estimate against the real files the server wrote: tokens × bytes/token + a header ≤ 256 B.
    fetched = json.loads((cfg.run_dir / "train" / "online-fetch.json").read_text())["samples"]
    per_token = hs_mode.per_token_bytes(cfg)
    index = json.loads(ExtractPaths.of(cfg).index.read_text())
    assert [s["tokens"] for s in fetched] == index["seq_len"]
    for s in fetched:
        overhead = s["file_bytes"] - s["tokens"] * per_token
        assert 0 < overhead <= HEADER_BYTES, s
        assert s["file_deleted"] and s["hidden_states_shape"] == [s["tokens"], 3 * manifest.hidden_size]
    assert sum(s["file_bytes"] for s in fetched) <= decision["offline_bytes"]  # the estimate is an upper bound
    assert max(s["file_bytes"] for s in fetched) <= CACHE_BOUND  # one sample in flight: the cache's true peak
