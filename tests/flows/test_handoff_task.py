"""The gpu_handoff Prefect task against the session's real Prefect server: never cached, its
report published as artifacts, a refused handoff fails the flow and leaves the foreign process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eagle3.process import procfs
from tests.procutil import LISTEN, Spawner
from tests.ports import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _config(make_config, tmp_path, port: int):
    (tmp_path / "shm").mkdir(exist_ok=True)
    return make_config({"datagen": {"server": {"port": port}}, "extract": {"server": {"port": free_port()}},
                        "bench": {"server": {"port": free_port()}},
                        "handoff": {"shm_dir": str(tmp_path / "shm"), "dev_dir": str(tmp_path / "dev"),
                                    "grace_s": 0.5, "deadline_s": 3}}, check_files=False)


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    return sorted(found, key=lambda a: a.created)


def test_handoff_task_publishes_its_report_and_is_never_cached(prefect_server, make_config, tmp_path):
    from prefect import flow

    from tasks.artifact_keys import artifact_key
    from tasks.handoff import gpu_handoff

    cfg = _config(make_config, tmp_path, free_port())
    (tmp_path / "shm" / "nccl-leftover").write_bytes(b"x")

    @flow
    def twice(path: str):
        return gpu_handoff(path, after="datagen"), gpu_handoff(path, after="datagen")

    first, second = twice(str(tmp_path / "config.yaml"))
    assert first["ok"] and second["ok"] and first["path"] != second["path"]  # ran twice: no cache
    assert not (tmp_path / "shm" / "nccl-leftover").exists()
    key = artifact_key(cfg.name, "handoff", "datagen-to-extract")
    md = _artifact(key)
    assert len(md) == 2, "one artifact per handoff"
    assert md[-1].data.startswith("**GPU handoff datagen-to-extract (") and "GPUs free" in md[-1].data
    assert "skipped: no GPUs declared (CPU rehearsal)" in md[-1].data and "<details>" in md[-1].data
    assert not _artifact(f"{key}-gpus"), "no separate GPU table: the GPU rows are in the markdown"


def test_refused_handoff_fails_the_flow_and_publishes_why(prefect_server, make_config, tmp_path):
    from prefect import flow

    from tasks.artifact_keys import artifact_key
    from tasks.handoff import gpu_handoff

    port = free_port()
    cfg = _config(make_config, tmp_path, port)
    spawner = Spawner()
    try:
        server = spawner.start(LISTEN, port)

        @flow
        def one(path: str):
            return gpu_handoff(path, after="start")

        state = one(str(tmp_path / "config.yaml"), return_state=True)
        assert state.is_failed()
        assert procfs.alive(server.pid)
        md = _artifact(artifact_key(cfg.name, "handoff", "start-to-datagen"))
        assert md and "BLOCKED" in md[-1].data and f"PID {server.pid}" in md[-1].data
    finally:
        spawner.cleanup()
