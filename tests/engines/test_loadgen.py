"""The vLLM load-generator driver (eagle3/engines/loadgen.py + engine_side/vllm_bench_driver.py) with a stand-in
for vllm.benchmarks.serve (fake_vllm_bench/): every window of a server runs in one supervised
process, in order; a failing window is reported with its traceback and the next one still runs;
an over-budget window and a driver that cannot start are errors with the log tail; stopping leaves
no process and an empty registry. The real client runs in tests/phases/test_bench.py (slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from eagle3.process import procfs
from eagle3.config import EngineEnv
from eagle3 import engine_registry
from eagle3.engines import loadgen
from eagle3.engines.loadgen import DriverClient
from eagle3.errors import CommandFailed, ServiceStartTimeout
from eagle3.process.services import Supervisor, state_dir_for

FAKE = Path(__file__).parent / "fake_vllm_bench"
VLLM = engine_registry.get("vllm")


def _client(tmp_path, **env) -> tuple[DriverClient, Supervisor]:
    sup = Supervisor(state_dir_for(tmp_path / "run"))
    engine = EngineEnv(python=Path(sys.executable), env={"PYTHONPATH": str(FAKE)})
    env = {"PYTHONPATH": str(FAKE), "FAKE_BENCH_CALLS": str(tmp_path / "calls"), **env}
    client = VLLM.open_load_client(sup, engine, env, "bench-client-k3", tmp_path / "bench" / "logs", "bench", 60.0)
    assert isinstance(client, DriverClient)
    return client, sup


def _spec(tmp_path, c: int) -> loadgen.LoadSpec:
    return loadgen.LoadSpec("http://127.0.0.1:1", "tiny", Path("/m"), tmp_path / "d.jsonl", 8, c, 16, 0.0, False,
                                tmp_path / "bench" / "clients" / f"k3-c{c}.json")


def test_all_windows_of_a_server_run_in_one_process_in_order(tmp_path):
    client, sup = _client(tmp_path)
    (tmp_path / "bench" / "clients").mkdir(parents=True)
    try:
        for c in (1, 4):
            client.run(_spec(tmp_path, c), timeout_s=60)
            load = VLLM.parse_load(tmp_path / "bench" / "clients" / f"k3-c{c}.json")
            assert load.completed == 8 and load.total_output_tokens == 8 * 16
        calls = [line.split() for line in (tmp_path / "calls").read_text().splitlines()]
        assert [c for _, c in calls] == ["1", "4"] and len({pid for pid, _ in calls}) == 1
        assert calls[0][0] == str(client.proc.pid), "run by the supervised driver, not a process per window"
        log = client.log.read_text()
        assert log.count("ready after") == 1 and "job 2: vllm bench serve --backend openai-chat" in log
    finally:
        client.stop()
    assert not procfs.group_members(client.proc.entry.pgid) and sup.registry.entries() == []


def test_a_failed_window_is_reported_and_the_next_one_still_runs(tmp_path):
    client, _ = _client(tmp_path, FAKE_BENCH_FAIL_ON_CALL="1")
    (tmp_path / "bench" / "clients").mkdir(parents=True)
    try:
        with pytest.raises(CommandFailed, match="bench-client-k3: vllm bench serve failed with exit code 1 .window 1.") as err:
            client.run(_spec(tmp_path, 1), timeout_s=60)
        assert "fake client failure on call 1" in str(err.value) and not err.value.retryable
        client.run(_spec(tmp_path, 4), timeout_s=60)
        assert VLLM.parse_load(tmp_path / "bench" / "clients" / "k3-c4.json").completed == 8
    finally:
        client.stop()


def test_a_window_over_its_budget_stops_the_driver(tmp_path):
    client, sup = _client(tmp_path, FAKE_BENCH_SLEEP="30")
    with pytest.raises(ServiceStartTimeout, match="window 1 did not finish within 3 s"):
        client.run(_spec(tmp_path, 1), timeout_s=3)
    assert client.proc.poll() is not None and sup.registry.entries() == []


def test_a_driver_that_cannot_start_fails_the_window_with_its_log(tmp_path):
    sup = Supervisor(state_dir_for(tmp_path / "run"))
    client = VLLM.open_load_client(sup, EngineEnv(python=Path(sys.executable)), {}, "bench-client-baseline",
                         tmp_path / "logs", "bench", 60.0)  # no vllm importable
    with pytest.raises(CommandFailed, match="bench-client-baseline exited with code 1") as err:
        client.run(_spec(tmp_path, 1), timeout_s=60)
    assert "No module named 'vllm'" in str(err.value)
    assert sup.registry.entries() == []
