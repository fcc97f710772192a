"""A datagen phase body for the signal tests (the phase table TABLE, through EAGLE3_PHASE_TABLE): it launches
a stand-in server through the pack's Supervisor, as the real phase does, whose process group has a
SIGTERM-deaf worker, writes what it launched to <run_dir>/datagen/service.json, then blocks until
the run is interrupted."""

from __future__ import annotations

import json
import sys
import time

from eagle3.process import procfs
from eagle3.phase_table import with_runs
from eagle3.process.services import LaunchSpec

SERVICE = """
import subprocess, sys, time
deaf = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nprint('deaf', flush=True)\\n" \\
       "while True: time.sleep(1)"
worker = subprocess.Popen([sys.executable, "-c", deaf])
print("worker", worker.pid, flush=True)
while True: time.sleep(1)
"""


def datagen(cfg, sup):
    out = cfg.phase_dir("datagen")
    out.mkdir(parents=True, exist_ok=True)
    proc = sup.launch(LaunchSpec(name="datagen-standin-server", argv=[sys.executable, "-c", SERVICE],
                                 log=out / "service.log", phase="datagen", stop_grace_s=2))
    deadline = time.monotonic() + 60
    while not ((lines := [l for l in proc.log_tail().splitlines() if l.startswith("worker ")])
               and "deaf" in proc.log_tail().splitlines()):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"stand-in service did not start:\n{proc.log_tail()}")
        time.sleep(0.05)
    worker = int(lines[-1].split()[1])
    members = [{"pid": pid, "start_ticks": procfs.start_ticks(pid)} for pid in (proc.pid, worker)]
    tmp = out / "service.json.tmp"
    tmp.write_text(json.dumps({"pgid": proc.entry.pgid, "members": members}))
    tmp.replace(out / "service.json")
    while True:  # until the run is interrupted
        time.sleep(0.2)


TABLE = with_runs({"datagen": "signal_phases:datagen"})
