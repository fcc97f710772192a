"""Real helper processes for the supervision and handoff tests, and their cleanup.

Every process a test starts is tracked by PID and start time and ended at teardown by PID only
(never by name), after checking it is still the same process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from eagle3 import procfs

PY = sys.executable

# Holds files (absolute paths among its args) open, or mapped with "map", until killed; prints
# "ready" once it holds them.
HOLD = r"""
import mmap, signal, sys, time
if "ignore-term" in sys.argv: signal.signal(signal.SIGTERM, signal.SIG_IGN)
held = []
for path in [a for a in sys.argv[1:] if a.startswith("/")]:
    f = open(path, "rb")
    if "map" in sys.argv:
        held.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)); f.close()
    else:
        held.append(f)
print("ready", flush=True)
while True: time.sleep(1)
"""

SLEEP = "import sys, time\nprint('ready', flush=True)\nwhile True: time.sleep(1)\n"

LISTEN = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("ready", flush=True)
while True: time.sleep(1)
"""


DEAF = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n" \
       "while True: time.sleep(1)\n"


def wait_until(cond, timeout: float = 10.0, what: str = "condition", step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gone(pid: int) -> bool:
    return not procfs.alive(pid)


def holds(pid: int, path: Path) -> bool:
    return os.path.realpath(path) in procfs.open_paths(pid)


class Spawner:
    """Starts plain (unsupervised, hence foreign) processes and ends them at teardown."""

    def __init__(self):
        self.procs: list[tuple[subprocess.Popen, int]] = []
        self.pids: list[tuple[int, int]] = []  # (pid, start ticks) of grandchildren to clean up

    def start(self, code: str, *args: str, argv0: str | None = None, ready: bool = True,
              env: dict | None = None) -> subprocess.Popen:
        argv = [argv0 or PY, "-c", code, *map(str, args)]
        p = subprocess.Popen(argv, executable=PY, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                             start_new_session=True, env=env)
        self.procs.append((p, procfs.start_ticks(p.pid)))
        if ready:
            line = p.stdout.readline()
            assert line.strip() == "ready", f"helper did not start: {line!r}"
        return p

    def track(self, pid: int) -> None:
        self.pids.append((pid, procfs.start_ticks(pid)))

    def cleanup(self) -> None:
        for p, ticks in self.procs:
            if p.poll() is None and procfs.start_ticks(p.pid) == ticks:
                p.kill()
            p.wait(timeout=10)
            if p.stdout:
                p.stdout.close()
        for pid, ticks in self.pids:
            if ticks is not None and procfs.start_ticks(pid) == ticks and procfs.alive(pid):
                os.kill(pid, signal.SIGKILL)
