"""A node gone before its shard starts (issue 41), for real: the session's `prefect server`, two node pools,
`eagle3 run` as the coordinator, and instant stand-in phases (noop_phases.SHARDED: datagen shardable) so
that only the coordinator's placement is under test. Pool "gone" never gets a worker.

- No pool has a worker when the phase starts: the shards go to both pools; then node A's worker comes up.
  The shard sent to "gone" waits past fanout.start_timeout_s, its run is cancelled, and it moves to A:
  both shards end on A, the move is recorded with its cause, and no retry is spent on it.
- A forced rerun, with A online: "gone" is named at once and both shards start on A."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import noop_phases
import pytest
import yaml
from flowkit import PREFECT, REPO, WORKER_STOP, client, stop_groups, wait_until

from eagle3.layout import RunLayout

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
POOLS = {"A": "eagle3-move-a", "gone": "eagle3-move-gone"}


def _pools() -> None:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    with client() as c:  # = `prefect work-pool create P --type process` + `set-concurrency-limit P 1`
        for pool in POOLS.values():
            c.create_work_pool(WorkPoolCreate(name=pool, type="process", concurrency_limit=1,
                                              base_job_template=ProcessWorker.get_default_base_job_template()))


def _ledger(run_dir: Path) -> list[dict]:
    return json.loads(RunLayout(run_dir).shards_record.read_text())["datagen"]["shards"]


def _coordinate(path: str, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([EAGLE3, "run", path, "--only", "datagen", "--no-doctor", *extra], env=env, cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_a_shard_whose_pool_has_no_worker_moves_and_a_dead_pool_is_named_at_once(prefect_server, tmp_path):
    _pools()
    env = prefect_server.env | noop_phases.overrides_env() | {"EAGLE3_PHASE_TABLE": "noop_phases:SHARDED"}
    path = noop_phases.write_noop_config(tmp_path, name="fanout-moves")
    raw = yaml.safe_load(Path(path).read_text())
    raw["fanout"] = {"pools": [POOLS["A"], POOLS["gone"]], "shards": {"datagen": 2}, "start_timeout_s": 3.0,
                     "poll_interval_s": 0.5, "retries": 0}
    Path(path).write_text(yaml.safe_dump(raw))
    run_dir = tmp_path / "run"
    log = tmp_path / "worker-A.log"
    workers = []
    try:
        coordinator = _coordinate(str(path), env)
        wait_until(lambda: RunLayout(run_dir).shards_record.is_file() or coordinator.poll() is not None, 120,
                   "both shards to be sent")
        assert coordinator.poll() is None, coordinator.stdout.read()
        assert {e["pool"] for e in _ledger(run_dir)} == set(POOLS.values()), "no worker anywhere: both pools used"
        with open(log, "ab") as out:  # node A comes up; "gone" never does
            workers.append(subprocess.Popen([PREFECT, "worker", "start", "--pool", POOLS["A"], "--type", "process"],
                                            env=env | {"EAGLE3_LOCK_DIR": str(tmp_path / "locks-A")}, cwd=REPO,
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))
        out, _ = coordinator.communicate(timeout=300)
        assert coordinator.returncode == 0, out[-4000:]
        shards = _ledger(run_dir)
        assert [(e["pool"], e["state"]) for e in shards] == [(POOLS["A"], "Completed")] * 2, shards
        [moved] = [e for e in shards if e["earlier"]]
        [before] = moved["earlier"]
        assert before["pool"] == POOLS["gone"] and before["state"] == "moved" and moved["attempt"] == 2
        assert before["cause"].endswith(f"pool {POOLS['gone']} has no worker"), before
        assert "fanout.start_timeout_s 3" in before["cause"], "retries 0, yet it went on: a move is not a retry"
        with client() as c:
            assert c.read_flow_run(before["flow_run"]).state.type.value == "CANCELLED", "the unstarted run is cancelled"
        assert (run_dir / "datagen" / "output.txt").read_text().count("datagen output") == 2

        rerun = _coordinate(str(path), env, "--force", "datagen")
        out, _ = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, out[-4000:]
        assert f"pool {POOLS['gone']} has no worker: shards start on {POOLS['A']}" in " ".join(out.split()), out[-3000:]
        shards = _ledger(run_dir)
        assert [(e["pool"], e["attempt"], e["earlier"]) for e in shards] == [(POOLS["A"], 1, [])] * 2, shards

        # Shard 0's process dies the moment its done marker is written (as when its worker is lost at the
        # end): Prefect calls the run Crashed, yet the shard's output is complete and verified, so it counts
        # as done, with the real story as its cause, and is not run again.
        shard0 = RunLayout(run_dir).shard_run_dir("datagen", 0, 2)
        (shard0 / "knobs.json").write_text(json.dumps({"die_after_done": ["datagen"]}))
        rerun = _coordinate(str(path), env, "--force", "datagen")
        out, _ = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, out[-4000:]
        first = _ledger(run_dir)[0]
        assert first["attempt"] == 1 and first["state"] == "Completed (verified after its run ended Crashed)", first
        assert "after its output was complete and verified" in first["cause"], first
        assert len((shard0 / "counts" / "datagen").read_text().splitlines()) == 3, "three forced runs, no retry"
        assert (run_dir / "datagen" / "output.txt").read_text().count("datagen output") == 2
    finally:
        stop_groups(workers, WORKER_STOP)
