"""deployments/serve.py, the single-host alternative to the pool: it registers both deployments
(the benchmark with its cron schedule), runs one flow run at a time (limit=1), and on SIGTERM
pauses its deployments and exits."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest
from flowkit import (PHASES, REPO, client, config, end_leftovers, params, phase_states, stop_group, submit, wait_final,
                     wait_until)
from noop_phases import counts, overrides_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_serve_runs_one_at_a_time_and_pauses_on_sigterm(prefect_server, tmp_path):
    (p1, run1), (p2, run2) = config(tmp_path / "s1", "serve-1"), config(tmp_path / "s2", "serve-2")
    log = tmp_path / "serve.log"
    mark = f"serve-{uuid.uuid4().hex}"  # carried by serve.py and the flow runs it starts, nothing else
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, str(REPO / "deployments" / "serve.py"), "--config", p1,
                                 "--name", "serve-test", "--cron", "0 3 * * *"],
                                env=prefect_server.env | overrides_env() | {"EAGLE3_TEST_MARK": mark}, cwd=tmp_path, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def registered():
            assert proc.poll() is None, f"serve.py exited:\n{log.read_text()[-3000:]}"
            with client() as c:
                try:
                    return c.read_deployment_by_name("eagle3-pipeline/serve-test"), \
                        c.read_deployment_by_name("eagle3-benchmark/serve-test")
                except Exception:  # noqa: BLE001 - ObjectNotFound until serve registered them
                    return None

        pipe, bench = wait_until(registered, 180, "serve.py to register its deployments")
        assert pipe.parameters["config_path"] == p1 and not pipe.schedules
        assert [(s.schedule.cron, s.active) for s in bench.schedules] == [("0 3 * * *", True)]

        ids = [submit("eagle3-pipeline/serve-test", params(p)) for p in (p1, p2)]
        runs = wait_final(ids, timeout=400)
        for rid, run_dir in zip(ids, (run1, run2)):
            assert runs[rid].state.is_completed(), runs[rid].state
            assert phase_states(rid) == dict.fromkeys(PHASES, "Completed")
            assert counts(run_dir) == dict.fromkeys(PHASES, 1)
        first, second = sorted(runs.values(), key=lambda r: r.start_time)
        assert second.start_time >= first.end_time, "limit=1: the second run waited for the first"

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        assert proc.returncode is not None and time.monotonic() - t0 < 60
        with client() as c:
            bench = c.read_deployment_by_name("eagle3-benchmark/serve-test")
        assert bench.paused, "serve.py pauses its deployments (and so the cron schedule) when it stops"
    finally:
        stop_group(proc)
        left = end_leftovers("EAGLE3_TEST_MARK", mark)
    assert not left, f"processes of serve.py outlived it: {left}"
