"""Classifying GPU holders: owned (token or registered group), protected, foreign."""

from __future__ import annotations

import os
import sys

import pytest

from eagle3.process import procfs
from eagle3.handoff.holders import Ownership, find_holders
from eagle3.process.services import LaunchSpec, Supervisor, state_dir_for
from tests.fakegpu import FakeGpuBackend
from tests.procutil import HOLD, PY, wait_until

pytestmark = pytest.mark.timeout(60)

# A service whose worker drops the environment (no owner token) but stays in the service's group.
SCRUBBED = """
import subprocess, sys, time
w = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], env={})
print("worker", w.pid, flush=True)
while True: time.sleep(1)
"""


def test_classification(tmp_path, spawner):
    fake = FakeGpuBackend(tmp_path / "dev", count=1)
    sup = Supervisor(state_dir_for(tmp_path / "run"))
    try:
        svc = sup.launch(LaunchSpec(name="svc", argv=[PY, "-c", SCRUBBED, str(fake.device(0)), HOLD],
                                    log=tmp_path / "svc.log"))
        worker = int(wait_until(lambda: [l for l in svc.log_tail().splitlines() if l.startswith("worker ")],
                                what="worker")[0].split()[1])
        spawner.track(worker)
        owned = sup.launch(LaunchSpec(name="own", argv=[PY, "-c", HOLD, str(fake.device(0))], log=tmp_path / "o.log"))
        foreign = spawner.start(HOLD, fake.device(0))
        daemon = spawner.start(HOLD, fake.device(0), argv0="nvidia-persistenced")
        wait_until(lambda: len(fake.snapshot()[0].processes) == 4, what="4 holders")
        me = open(fake.device(0))  # the handoff process itself may hold device files (NVML does)
        try:
            ownership = Ownership.build(sup.registry.token, sup.registry.entries(), ["nvidia-persistenced"])
            holders = find_holders(fake.snapshot(), fake.dev_dir, ownership)
        finally:
            me.close()
        got = {pid: (h.cls, h.why) for pid, h in holders.items()}
        assert got[owned.pid] == ("owned", "carries this run's owner token")
        assert got[worker][0] == "owned" and "registered process group" in got[worker][1]
        assert procfs.environ_value(worker, "EAGLE3_OWNER_TOKEN") is None
        assert got[foreign.pid] == ("foreign", "not started by this pipeline")
        assert got[daemon.pid][0] == "protected" and "nvidia-persistenced" in got[daemon.pid][1]
        assert got[os.getpid()][0] == "protected"
        assert holders[foreign.pid].via == {"fd", "nvml-compute"} and holders[foreign.pid].gpus == {0}
    finally:
        sup.stop_all()


def test_fd_only_holders_foreign_are_observers_owned_stay_owned(tmp_path, spawner):
    """On no NVML list of any GPU (a monitor like `nvidia-smi dmon`, an NVML reader, or our own
    server before CUDA init): an observer if neither owned nor protected; ownership wins."""
    fake = FakeGpuBackend(tmp_path / "dev", count=2)
    sup = Supervisor(state_dir_for(tmp_path / "run"))
    try:
        own = sup.launch(LaunchSpec(name="own", argv=[PY, "-c", HOLD, str(fake.device(0))], log=tmp_path / "o.log"))
        monitor = spawner.start(HOLD, fake.device(0), fake.device(1))
        daemon = spawner.start(HOLD, fake.device(1), argv0="nv-hostengine")
        cuda = spawner.start(HOLD, fake.device(0), fake.device(1))  # context on GPU 1 only
        wait_until(lambda: "ready" in own.log_tail(), what="owned holder ready")
        for p in (own.pid, monitor.pid, daemon.pid):
            fake.contexts[p] = set()
        fake.contexts[cuda.pid] = {1}
        ownership = Ownership.build(sup.registry.token, sup.registry.entries(), ["nv-hostengine"])
        holders = find_holders(fake.snapshot(), fake.dev_dir, ownership)
        got = {pid: (h.cls, sorted(h.gpus), sorted(h.via)) for pid, h in holders.items()}
        assert got == {own.pid: ("owned", [0], ["fd"]), monitor.pid: ("observer", [0, 1], ["fd"]),
                       daemon.pid: ("protected", [1], ["fd"]), cuda.pid: ("foreign", [1], ["fd", "nvml-compute"])}
        assert "no GPU context" in holders[monitor.pid].why
    finally:
        sup.stop_all()
