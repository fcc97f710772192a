"""Fan-out over two nodes (docs/fanout.md), for real: the session's `prefect server`, two process
pools with a `prefect worker` each acting as two nodes (their own GPU-lease dir, their servers on
ports 100 apart), `eagle3 run` as the coordinator, the real datagen and extract phases with CPU
vLLM servers, each shard on the node its pool names.

One scenario, asserted piece by piece: datagen in 2 shards, during which node A (its worker and
the shard's flow-run process) is killed with SIGKILL mid-shard; the shard is declared lost by its
silent heartbeat, retried on node B, and resumes from the rows it had. Node A's worker comes back
for extract in 2 shards. The result is compared with the same prompts generated unsharded (the
session's shared vLLM server, same settings, greedy)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from flowkit import PREFECT, REPO, WORKER_STOP, client, stop_group, stop_groups, wait_until

from eagle3.process import procfs
from tests.conftest import write_tiny_config

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(900)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
SAMPLES = 12
OFFSET_B = 100


@dataclass
class Node:
    pool: str
    env: dict
    log: Path
    procs: list = field(default_factory=list)

    def start(self) -> None:
        out = open(self.log, "ab")
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", self.pool, "--type", "process"], env=self.env,
                                cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
        out.close()
        self.procs.append(proc)
        wait_until(lambda: "started!" in self.log.read_text() or proc.poll() is not None, 120, f"worker {self.pool}")
        assert proc.poll() is None, self.log.read_text()[-2000:]

    @property
    def worker(self) -> subprocess.Popen:
        return self.procs[-1]

    def stop(self) -> None:
        stop_nodes([self])


def stop_nodes(nodes) -> None:
    """Every worker of these nodes at once (flowkit.WORKER_STOP: a worker ends on its second signal)."""
    stop_groups([p for n in nodes for p in n.procs], WORKER_STOP)


@dataclass
class Scenario:
    cfg: object
    config_path: Path
    nodes: dict
    datagen: subprocess.CompletedProcess
    extract: subprocess.CompletedProcess
    killed: dict  # what was killed on node A, and the shard's server it left
    unsharded_rows: dict
    status: str


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _coordinate(cfg_path: Path, env: dict, phase: str) -> subprocess.Popen:
    return subprocess.Popen([EAGLE3, "run", str(cfg_path), "--only", phase, "--no-doctor"], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.fixture(scope="module")
def scenario(prefect_server, tiny_model, vllm_server, tmp_path_factory):
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    from eagle3.layout import RunLayout
    from eagle3.phases.datagen import run_datagen

    base = tmp_path_factory.mktemp("fanout")
    pools = {"A": "eagle3-node-a", "B": "eagle3-node-b"}
    with client() as c:
        for pool in pools.values():  # = `prefect work-pool create P --type process` + `set-concurrency-limit P 1`
            c.create_work_pool(WorkPoolCreate(name=pool, type="process", concurrency_limit=1,
                                              base_job_template=ProcessWorker.get_default_base_job_template()))
    greedy = {"sampling": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 48, "seed": 0}, "max_samples": SAMPLES,
              "concurrency": 1}
    cfg = write_tiny_config(base, {"name": "fanout-two-nodes",
        "target": {"model": str(tiny_model)}, "datagen": greedy,
        "fanout": {"pools": list(pools.values()), "shards": {"datagen": 2, "extract": 2}, "heartbeat_timeout_s": 15.0,
                   "poll_interval_s": 1.0, "retries": 2}}, port_offsets=(0, OFFSET_B))
    config_path = base / "config.yaml"
    nodes, coordinators = {}, []
    for key, pool in pools.items():
        locks = base / f"locks-{key}"
        locks.mkdir()
        env = prefect_server.env | {"EAGLE3_LOCK_DIR": str(locks), "EAGLE3_PORT_OFFSET": str(OFFSET_B if key == "B" else 0)}
        nodes[key] = Node(pool, env, base / f"worker-{key}.log")
        nodes[key].start()
    try:
        # datagen: kill node A (worker + the shard's flow-run process) once its shard has written a row
        coordinator = _coordinate(config_path, prefect_server.env, "datagen")
        coordinators.append(coordinator)
        shard0 = RunLayout(cfg.run_dir).shard_run_dir("datagen", 0, 2)
        samples0 = shard0 / "datagen" / "samples.jsonl"
        wait_until(lambda: (samples0.is_file() and samples0.read_text().count("\n") >= 1) or coordinator.poll() is not None,
                   600, "shard 1 of datagen to write its first row", step=0.1)
        assert coordinator.poll() is None, coordinator.stdout.read()
        beat = json.loads((shard0 / "state" / "heartbeat.json").read_text())
        entries = json.loads((shard0 / "state" / "services.json").read_text())
        entries = entries.get("entries", entries) if isinstance(entries, dict) else entries
        server = next(e for e in entries if e["phase"] == "datagen")
        assert procfs.environ_value(beat["pid"], "PREFECT_HOME") == str(prefect_server.home), "not this session's"
        os.killpg(nodes["A"].worker.pid, signal.SIGKILL)
        os.killpg(os.getpgid(beat["pid"]), signal.SIGKILL)
        rows_at_kill = samples0.read_text().count("\n")
        killed = {"flow_run_pid": beat["pid"], "server_pid": server["pid"], "server_ticks": server.get("start_ticks"),
                  "rows": rows_at_kill, "host": beat["host"]}
        out, _ = coordinator.communicate(timeout=600)
        datagen = subprocess.CompletedProcess(coordinator.args, coordinator.returncode, out)

        nodes["A"].start()  # node A comes back for extract
        coordinator = _coordinate(config_path, prefect_server.env, "extract")
        coordinators.append(coordinator)
        out, _ = coordinator.communicate(timeout=700)
        extract = subprocess.CompletedProcess(coordinator.args, coordinator.returncode, out)
        status = subprocess.run([EAGLE3, "status", str(config_path)], env=prefect_server.env, cwd=REPO,
                                capture_output=True, text=True, timeout=60).stdout

        # The same prompts unsharded, on the session's shared server (same model and server settings).
        (base / "unsharded").mkdir()
        plain = write_tiny_config(base / "unsharded", {"target": {"model": str(tiny_model)},
                                                       "datagen": {**greedy, "server": {"api_key": vllm_server.key}}})
        run_datagen(plain, None, base_url=vllm_server.base_url)
        unsharded = {r["id"]: r for r in _rows(plain.layout.samples)}
        yield Scenario(cfg, config_path, nodes, datagen, extract, killed, unsharded, status)
    finally:
        for proc in coordinators:  # a failed setup must not leave its coordinator running
            stop_group(proc)
        stop_nodes(nodes.values())


def test_two_shards_each_on_its_node_complete(scenario):
    assert scenario.datagen.returncode == 0, scenario.datagen.stdout[-4000:]
    assert scenario.extract.returncode == 0, scenario.extract.stdout[-4000:]
    record = json.loads((scenario.cfg.layout.state / "shards.json").read_text())
    extract = record["extract"]["shards"]
    assert [(s["index"], s["pool"], s["state"]) for s in extract] == [
        (0, "eagle3-node-a", "Completed"), (1, "eagle3-node-b", "Completed")]
    for phase in ("datagen", "extract"):
        assert json.loads((scenario.cfg.layout.state / f"{phase}.done.json").read_text())["phase"] == phase
    assert "shard 1/2: Completed on eagle3-node-a" in scenario.status and "shard 2/2: Completed on eagle3-node-b" \
        in scenario.status, scenario.status


def test_the_merged_dataset_has_every_prompt_exactly_once_as_unsharded(scenario):
    rows = _rows(scenario.cfg.layout.samples)
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)) == SAMPLES
    assert set(ids) == set(scenario.unsharded_rows)
    # Greedy, per-id requests: each prompt is one request whichever server answers it; only the
    # batch a request shares could change CPU numerics (concurrency 1 here: none).
    differ = [r["id"] for r in rows
              if r["conversations"][-1]["content"] != scenario.unsharded_rows[r["id"]]["conversations"][-1]["content"]]
    assert differ == [], f"greedy outputs differ between sharded and unsharded runs for {differ}"


def test_a_killed_node_s_shard_is_retried_elsewhere_and_keeps_its_rows(scenario):
    record = json.loads((scenario.cfg.layout.state / "shards.json").read_text())["datagen"]["shards"]
    first = record[0]
    assert first["pool"] == "eagle3-node-b" and first["attempt"] == 2 and first["state"] == "Completed", record
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with client() as c:  # by name: the session's server holds many runs, more than one page of them
        runs = c.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(like_=f"{scenario.cfg.name}: datagen shard 1/2")))
    states = sorted((r.name, r.state.name) for r in runs)
    assert [s for _, s in states] == ["Crashed", "Completed"], states
    lost = next(r for r in runs if r.state.name == "Crashed")
    assert "no heartbeat" in lost.state.message
    summary = json.loads((scenario.cfg.layout.shard_run_dir("datagen", 0, 2) / "datagen" / "summary.json").read_text())
    assert summary["resumed"] >= scenario.killed["rows"] >= 1, summary


def test_no_process_of_the_killed_shard_is_left(scenario):
    k = scenario.killed
    assert not procfs.alive(k["flow_run_pid"])
    server = procfs.read_stat(k["server_pid"])
    assert server is None or server.zombie or server.start_ticks != k["server_ticks"], "the killed shard's server lives"


def test_extract_merges_every_file_once_from_the_shard_that_owns_it(scenario):
    from eagle3.phases.extract_manifest import read_extract_manifest

    m = read_extract_manifest(scenario.cfg)
    hs = scenario.cfg.phase_dir("extract") / "hidden_states"
    assert m.num_samples == SAMPLES and sorted(p.name for p in hs.iterdir()) == sorted(
        f"hs_{i}.safetensors" for i in range(SAMPLES))
    for i in range(SAMPLES):
        owner = scenario.cfg.layout.shard_run_dir("extract", 0 if i < SAMPLES // 2 else 1, 2)
        assert (hs / f"hs_{i}.safetensors").stat().st_ino == (owner / "extract" / "hidden_states" /
                                                              f"hs_{i}.safetensors").stat().st_ino


def test_a_pool_that_does_not_exist_is_refused_before_anything_starts(prefect_server, tmp_path):
    cfg = write_tiny_config(tmp_path, {"name": "fanout-no-pool", "fanout": {"pools": ["no-such-pool"],
                                                                            "shards": {"datagen": 2}}}, check_files=False)
    res = subprocess.run([EAGLE3, "run", str(tmp_path / "config.yaml"), "--only", "datagen", "--no-doctor"],
                         env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=300)
    text = res.stdout + res.stderr
    assert res.returncode != 0
    assert "'no-such-pool' does not exist" in text and "prefect work-pool create no-such-pool" in text, text
    assert "prefect worker start --pool no-such-pool" in " ".join(text.split()), text  # the pool's own name, not NAME
    assert not (cfg.run_dir / "handoffs").exists() and not (cfg.run_dir / "shards").exists()


def test_the_fanout_bench_smoke_runs_both_sides_on_the_same_prompts(scenario, prefect_server):
    """bench/fanout_bench.py on this scenario's two nodes (tests/bench/test_bench_scripts.py lists it)."""
    res = subprocess.run([sys.executable, str(REPO / "bench" / "fanout_bench.py"), "--smoke", "--api-url",
                          prefect_server.api_url, "--pools", ",".join(n.pool for n in scenario.nodes.values())],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    result = json.loads(res.stdout[res.stdout.index("{"):])
    assert result["same_ids"] and result["samples"] == [4, 4] and "not a measurement" in result["smoke"]
    assert result["one_node_s"] > 0 and result["two_shards_s"] > 0


def test_a_shard_that_fails_for_good_names_its_shard_node_and_cause(prefect_server, tmp_path):
    """A node whose own setting is wrong (here its port offset) fails the shard in a way no retry
    fixes: the phase stops at once, naming the shard, the pool, the host and the cause."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    pool = "eagle3-node-misconfigured"
    with client() as c:
        c.create_work_pool(WorkPoolCreate(name=pool, type="process", concurrency_limit=1,
                                          base_job_template=ProcessWorker.get_default_base_job_template()))
    node = Node(pool, prefect_server.env | {"EAGLE3_PORT_OFFSET": "lots"}, tmp_path / "worker.log")
    node.start()
    try:
        write_tiny_config(tmp_path, {"name": "fanout-misconfigured-node",
                                     "fanout": {"pools": [pool], "shards": {"datagen": 2}, "poll_interval_s": 1.0}})
        res = subprocess.run([EAGLE3, "run", str(tmp_path / "config.yaml"), "--only", "datagen", "--no-doctor"],
                             env=prefect_server.env, cwd=REPO, capture_output=True, text=True, timeout=300)
    finally:
        node.stop()
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-3000:]
    assert f"datagen shard 1/2 failed on pool {pool}" in text and "on host " in text, text[-3000:]
    assert "$EAGLE3_PORT_OFFSET='lots' on this node" in text, text[-3000:]
