"""Real helper processes for the supervision and handoff tests, and their cleanup.

Every process a test starts is tracked by PID and start time and ended at teardown by PID only
(never by name), after checking it is still the same process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eagle3.process import procfs

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


class Freezer:
    """A cgroup-v1 freezer group: a frozen task sleeps in state D and a SIGKILL stays pending until
    the group is thawed, so it is a real process that survives SIGKILL (what a task stuck in a GPU
    driver call looks like to the handoff) without a hung driver. Needs root and a v1 freezer
    hierarchy mounted somewhere (`mount -t cgroup -o freezer freezer DIR`)."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir()

    @staticmethod
    def root() -> Path | None:
        try:
            mounts = Path("/proc/mounts").read_text().splitlines()
        except OSError:
            return None
        for line in mounts:
            _, where, fstype, opts, *_ = line.split()
            if fstype == "cgroup" and "freezer" in opts.split(",") and os.access(where, os.W_OK):
                return Path(where)
        return None

    def _state(self) -> str:
        return (self.path / "freezer.state").read_text().strip()

    def freeze(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))
        (self.path / "freezer.state").write_text("FROZEN")
        wait_until(lambda: self._state() == "FROZEN", what=f"freezer {self.path} FROZEN")

    def thaw(self) -> None:
        (self.path / "freezer.state").write_text("THAWED")
        wait_until(lambda: self._state() == "THAWED", what=f"freezer {self.path} THAWED")

    def remove(self) -> None:
        """Thaw (a pending SIGKILL then ends the task), hand anything left back to the root group, remove."""
        self.thaw()
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                (self.path.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # exited meanwhile
        wait_until(lambda: not (self.path / "cgroup.procs").read_text().strip(), what="freezer group empty")
        self.path.rmdir()
