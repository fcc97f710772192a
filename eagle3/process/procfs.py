"""Read-only views of processes: identity, groups, open device files, environment markers.

Identity is (pid, start time): a PID alone can be reused by an unrelated process, so every
decision to signal a process is taken against the start time recorded when it was launched.

psutil answers what it can (command line, environment, executable, parents, status, the PID
list). /proc is read directly for what psutil does not give: the exact start time in clock ticks
and the process group (/proc/PID/stat), the wait channel, open device files and file-backed
mappings (a GPU's device file, an inode under /dev/shm), and LISTEN sockets by inode
(psutil.net_connections has no inode and walks every process's fds on each call, while a
handoff polls its ports several times a second).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    pid: int
    ppid: int
    pgid: int
    state: str
    start_ticks: int
    comm: str

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def read_stat(pid: int) -> ProcInfo | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            raw = fh.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # comm may contain spaces and parentheses; it ends at the last ')'.
    lpar, rpar = raw.index("("), raw.rindex(")")
    fields = raw[rpar + 2:].split()
    return ProcInfo(pid=pid, comm=raw[lpar + 1:rpar], state=fields[0], ppid=int(fields[1]),
                    pgid=int(fields[2]), start_ticks=int(fields[19]))


# /proc/PID/stat state letters (fs/proc/array.c), for naming a process that will not exit.
STATE_NAMES = {"R": "running", "S": "sleeping", "D": "disk sleep: uninterruptible, a pending SIGKILL waits for "
               "the kernel call to return", "T": "stopped", "t": "tracing stop", "Z": "zombie", "X": "dead",
               "I": "idle", "P": "parked"}


@dataclass(frozen=True)
class TaskState:
    pid: int
    state: str  # the letter of /proc/PID/stat
    wchan: str  # kernel function it sleeps in (/proc/PID/wchan); "" when running or hidden

    def describe(self) -> str:
        name = STATE_NAMES.get(self.state, "unknown")
        return f"state {self.state} ({name}), wchan {self.wchan or '-'}"

    def to_dict(self) -> dict:
        return {"state": self.state, "state_name": STATE_NAMES.get(self.state, "unknown"), "wchan": self.wchan}


def task_state(pid: int) -> TaskState | None:
    """What a process is doing in the kernel; None if it is gone."""
    info = read_stat(pid)
    if info is None:
        return None
    try:
        wchan = (PROC / str(pid) / "wchan").read_text().strip()
    except OSError:
        wchan = ""
    return TaskState(pid=pid, state=info.state, wchan="" if wchan == "0" else wchan)


def start_time(pid: int) -> float | None:
    """Process start time in seconds since the epoch (psutil's create_time), None if gone."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def same_process(pid: int, recorded_start: float) -> bool:
    now = start_time(pid)
    return now is not None and abs(now - recorded_start) < 0.05


def start_ticks(pid: int) -> int | None:
    """Start time in clock ticks since boot: exact and immune to wall-clock steps (psutil's
    create_time adds the boot time, which is re-read per process and can drift by a second)."""
    info = read_stat(pid)
    return info.start_ticks if info is not None else None


def same_start(pid: int, recorded_ticks: int) -> bool:
    return start_ticks(pid) == recorded_ticks


def all_pids() -> list[int]:
    return psutil.pids()


def all_procs() -> list[ProcInfo]:
    return [info for pid in all_pids() if (info := read_stat(pid)) is not None]


def group_members(pgid: int, live_only: bool = True) -> list[ProcInfo]:
    return [p for p in all_procs() if p.pgid == pgid and not (live_only and p.zombie)]


_GONE = (psutil.Error, OSError)  # gone, a zombie, or another user's (AccessDenied)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except _GONE:
        return False


def _live(pid: int) -> bool:
    """alive() from one read of /proc/PID/stat: a whole-/proc scan (the handoff's proof) calls it for
    every process on the host, and psutil's answer costs two reads and an object each."""
    info = read_stat(pid)
    return info is not None and not info.zombie


def cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except _GONE:
        return []


def exe_name(pid: int) -> str:
    """The executable's file name; the process name where the executable cannot be read."""
    try:
        proc = psutil.Process(pid)
    except _GONE:
        return ""
    try:
        exe = proc.exe()
    except _GONE:
        exe = ""
    if exe:
        return os.path.basename(exe)
    try:
        return proc.name()
    except _GONE:
        return ""


def environ_value(pid: int, key: str) -> str | None:
    try:
        return psutil.Process(pid).environ().get(key)
    except _GONE:
        return None


def fd_links(pid: int):
    """(fd path, link target) for each open fd of `pid`; nothing if it is gone or unreadable."""
    fd_dir = f"/proc/{pid}/fd/"  # plain strings: pathlib costs more than the syscalls here
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return
    for fd in fds:
        try:
            yield fd_dir + fd, os.readlink(fd_dir + fd)
        except OSError:
            continue


def open_paths(pid: int, needle: str | None = None) -> set[str]:
    """Targets of the process's open fds plus file-backed mappings (a mapping outlives its fd).
    With `needle`, only paths containing it are returned, and a maps file without it is not parsed
    (a CUDA process maps thousands of regions; scanning every process must stay cheap)."""
    found = {target for _, target in fd_links(pid) if needle is None or needle in target}
    try:
        with open(f"/proc/{pid}/maps", "rb") as fh:
            raw = fh.read()
    except OSError:
        return found
    if needle is not None and needle.encode() not in raw:
        return found
    for line in raw.decode(errors="replace").splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and (needle is None or needle in parts[5]):
            found.add(parts[5].removesuffix(" (deleted)"))
    return found


def all_open_paths(keep=lambda path: True, needle: str | None = None) -> dict[str, set[int]]:
    """Path -> live PIDs that have it open or mapped, for the paths `keep` accepts (one /proc pass).
    `needle`, a substring every wanted path contains, makes the pass much cheaper."""
    result: dict[str, set[int]] = {}
    for pid in all_pids():
        if not _live(pid):
            continue
        for path in open_paths(pid, needle):
            if keep(path):
                result.setdefault(path, set()).add(pid)
    return result


def open_inodes_under(prefix: str) -> dict[tuple[int, int], set[int]]:
    """(st_dev, st_ino) -> live PIDs holding a file under `prefix` open or mapped.

    Identity must be the inode, not the path: glibc's sem_open maps a semaphore under a temporary
    name and then links it to its real name, so /proc/PID/maps shows `sem.XXXX (deleted)` while the
    live file is `sem.mp-...`; matching by path would call a live semaphore unused."""
    result: dict[tuple[int, int], set[int]] = {}
    for pid in all_pids():
        if not _live(pid):
            continue
        for fd_path, target in fd_links(pid):
            if not target.startswith(prefix):
                continue
            try:
                st = os.stat(fd_path)
            except OSError:
                continue
            result.setdefault((st.st_dev, st.st_ino), set()).add(pid)
        try:
            with open(PROC / str(pid) / "maps") as fh:
                for line in fh:
                    if prefix not in line:
                        continue
                    parts = line.split(maxsplit=5)
                    if len(parts) < 6 or not parts[5].startswith(prefix):
                        continue
                    major, minor = (int(x, 16) for x in parts[3].split(":"))
                    result.setdefault((os.makedev(major, minor), int(parts[4])), set()).add(pid)
        except OSError:
            continue
    return result


def ancestors(pid: int) -> set[int]:
    """`pid`, its parents up to init, and 1 (also when `pid` is gone)."""
    try:
        proc = psutil.Process(pid)
        return {pid, 1, *(p.pid for p in proc.parents())}
    except _GONE:
        return {1}


def listening_sockets(ports: set[int]) -> dict[int, set[int]]:
    """Port -> socket inodes in LISTEN state on this host (any address, IPv4 and IPv6)."""
    found: dict[int, set[int]] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != "0A":  # TCP_LISTEN
                continue
            port = int(cols[1].rsplit(":", 1)[1], 16)
            if port in ports:
                found.setdefault(port, set()).add(int(cols[9]))
    return found


def socket_pids(inodes: set[int]) -> dict[int, set[int]]:
    """Socket inode -> live PIDs holding it as an fd (how a listener is traced to its process)."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    result: dict[int, set[int]] = {}
    if not wanted:
        return result
    for pid in all_pids():
        for _, target in fd_links(pid):
            if target in wanted:
                result.setdefault(wanted[target], set()).add(pid)
    return result


def listening_ports(ports: set[int]) -> dict[int, str]:
    """Which of `ports` have a LISTEN socket on this host (any address), described by the PIDs
    and commands holding the socket where /proc shows them (not for another user's or namespace's)."""
    listening = listening_sockets(ports)
    owners = socket_pids({i for inodes in listening.values() for i in inodes})
    described = {}
    for port, inodes in listening.items():
        pids = sorted({pid for i in inodes for pid in owners.get(i, set())})
        who = ", ".join(f"PID {pid} ({' '.join(cmdline(pid))[:160] or '?'})" for pid in pids)
        described[port] = f"listened on by {who}" if pids else \
            f"LISTEN socket inode {', '.join(map(str, sorted(inodes)))}, holder not visible (another user or namespace)"
    return described
