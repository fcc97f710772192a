"""Read-only views of /proc: process identity, groups, open device files, environment markers.

Identity is (pid, start time): a PID alone can be reused by an unrelated process, so every
decision to signal a process is taken against the start time recorded when it was launched.
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
    return [int(p) for p in os.listdir(PROC) if p.isdigit()]


def all_procs() -> list[ProcInfo]:
    return [info for pid in all_pids() if (info := read_stat(pid)) is not None]


def group_members(pgid: int, live_only: bool = True) -> list[ProcInfo]:
    return [p for p in all_procs() if p.pgid == pgid and not (live_only and p.zombie)]


def alive(pid: int) -> bool:
    info = read_stat(pid)
    return info is not None and not info.zombie


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def exe_name(pid: int) -> str:
    try:
        return os.path.basename(os.readlink(PROC / str(pid) / "exe"))
    except OSError:
        info = read_stat(pid)
        return info.comm if info else ""


def environ_value(pid: int, key: str) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    prefix = key.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def uid_of(pid: int) -> int | None:
    try:
        return (PROC / str(pid)).stat().st_uid
    except OSError:
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
        if not alive(pid):
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
        if not alive(pid):
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


def holders_of(paths_match, pids: list[int] | None = None) -> dict[int, set[str]]:
    """PIDs (live, not zombie) whose fds or mappings satisfy `paths_match(path) -> bool`."""
    result: dict[int, set[str]] = {}
    for pid in pids if pids is not None else all_pids():
        if not alive(pid):
            continue
        hits = {p for p in open_paths(pid) if paths_match(p)}
        if hits:
            result[pid] = hits
    return result


def ancestors(pid: int) -> set[int]:
    out: set[int] = set()
    while pid > 1:
        info = read_stat(pid)
        if info is None:
            break
        out.add(pid)
        pid = info.ppid
    out.add(1)
    return out


def descendants(pid: int, procs: list[ProcInfo] | None = None) -> set[int]:
    procs = procs if procs is not None else all_procs()
    children: dict[int, list[int]] = {}
    for p in procs:
        children.setdefault(p.ppid, []).append(p.pid)
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


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
