"""Who holds a GPU, and whose process is it.

Holders are the union of NVML's process lists and a /proc scan for open or mapped GPU device
files (/dev/nvidiaN of the GPUs in question; /dev/nvidiactl alone is not a GPU: every NVML
reader, this process included, opens it). Each holder is classified:
  owned      - started by this pipeline: carries the run's owner token, or is a member of a
               registry group whose live leader is provably still ours (PID + start time + token);
  protected  - never signalled: PID 1, this process and its ancestors (the orchestrator),
               and configured system daemons (persistence daemon, fabric manager, DCGM, ...);
  observer   - not owned or protected, holds a GPU's device file but is on no NVML process list
               (compute, graphics, MPS) of any GPU: a monitor (nvidia-smi dmon, nvtop,
               dcgm-exporter, a Python NVML reader) with no context and no memory. It does not block
               by itself; a GPU whose NVML v2 used memory is over the threshold still blocks, naming
               it, since memory NVML attributes to no visible process may be a context from another
               PID namespace (a container) that looks exactly like this;
  foreign    - anything else, including an NVML PID absent from our /proc (another PID
               namespace): it blocks the handoff and is named in the error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from ..process import procfs
from .gpus import GpuState
from ..process.services import OWNER_ENV, Entry, proof

COMM_LEN = 15  # the kernel truncates comm to 15 characters
OBSERVER_WHY = "no GPU context: holds the device file, on no NVML process list of any GPU (a monitor or NVML reader)"


@dataclass
class Holder:
    pid: int
    gpus: set[int] = field(default_factory=set)
    via: set[str] = field(default_factory=set)  # "nvml-compute", "nvml-graphics", "nvml-mps", "fd"
    used_mib: float | None = None
    cls: str = "foreign"  # "owned", "protected", "observer" or "foreign"
    why: str = ""
    comm: str = ""
    cmd: str = ""
    start_ticks: int | None = None

    def to_dict(self) -> dict:
        return {"pid": self.pid, "class": self.cls, "why": self.why, "gpus": sorted(self.gpus),
                "via": sorted(self.via), "used_mib": self.used_mib, "comm": self.comm, "cmd": self.cmd}

    def label(self) -> str:
        return f"PID {self.pid} ({self.cmd or self.comm or '?'})"


def describe_cmd(pid: int, limit: int = 200) -> str:
    """The command line on one line; long ones keep head and tail (where --port and model live)."""
    text = " ".join(" ".join(procfs.cmdline(pid)).split())
    return text if len(text) <= limit else f"{text[: limit - 63]} ... {text[-58:]}"


@dataclass
class Ownership:
    """Everything needed to decide whose a process is, captured once per handoff."""

    token: str | None
    groups: set[int]  # pgids of registry entries whose live leader is proven ours (start ticks + owner token)
    protected_names: set[str]
    protected_pids: set[int]
    run_service_groups: set[int] = field(default_factory=set)  # pgids of a live run's own services

    @classmethod
    def build(cls, token: str | None, entries: Iterable[Entry], protected_names: Iterable[str],
              self_pid: int | None = None) -> "Ownership":
        groups, run_services = set(), set()
        for e in entries:
            # Only a group whose live leader proves it ours (start ticks and the owner token): a
            # registry names PIDs that anyone can read in /proc. Members of a group whose leader is
            # gone are ours only by the token they carry.
            if token and proof(e, token) == "ours":
                (run_services if e.serves_a_live_run() else groups).add(e.pgid)
        me = os.getpid() if self_pid is None else self_pid
        return cls(token=token, groups=groups, protected_names=set(protected_names),
                   protected_pids=procfs.ancestors(me) | {me, 1}, run_service_groups=run_services)

    def spares(self, info: procfs.ProcInfo) -> bool:
        """Never signalled by a handoff: the orchestrator and its ancestors, PID 1, a live run's own services."""
        return info.pid in self.protected_pids or info.pgid in self.run_service_groups

    def _protected_name(self, pid: int, comm: str) -> str | None:
        argv = procfs.cmdline(pid)
        names = {procfs.exe_name(pid), os.path.basename(argv[0]) if argv else ""}
        for name in self.protected_names:
            if name in names or comm == name[:COMM_LEN]:
                return name
        return None

    def classify(self, pid: int) -> tuple[str, str]:
        info = procfs.read_stat(pid)
        if info is None:
            return "foreign", "not visible in this host's /proc (other PID namespace?): cannot verify"
        if pid in self.protected_pids:
            return "protected", "this handoff process, its ancestors (orchestrator) or PID 1"
        if info.pgid in self.run_service_groups:
            return "protected", "a service of the live run itself (e.g. its Prefect server)"
        name = self._protected_name(pid, info.comm)
        if name:
            return "protected", f"system process '{name}' (handoff.protected_process_names)"
        if self.token and procfs.environ_value(pid, OWNER_ENV) == self.token:
            return "owned", "carries this run's owner token"
        if info.pgid in self.groups:
            return "owned", f"member of registered process group {info.pgid}"
        return "foreign", "not started by this pipeline"


def device_paths(states: list[GpuState], dev_dir: Path) -> dict[str, int]:
    """Real path of each GPU's device file -> GPU index (paths as /proc readlink reports them)."""
    paths: dict[str, int] = {}
    for s in states:
        f = s.device_file(dev_dir)
        if f is not None:
            paths[os.path.realpath(f)] = s.index
    return paths


def _open_device_files(paths: dict[str, int]) -> dict[str, set[int]]:
    if not paths:
        return {}
    return procfs.all_open_paths(lambda p: p in paths, needle=os.path.commonpath(list(paths)))


def device_file_holders(states: list[GpuState], dev_dir: Path, gpus: Iterable[int] | None = None) -> dict[str, set[int]]:
    """The /proc pass of find_holders: device-file path -> live PIDs that have it open or mapped."""
    wanted = set(gpus) if gpus is not None else {s.index for s in states}
    return _open_device_files(device_paths([s for s in states if s.index in wanted], dev_dir))


def find_holders(states: list[GpuState], dev_dir: Path, ownership: Ownership,
                 gpus: Iterable[int] | None = None, open_files: dict[str, set[int]] | None = None) -> dict[int, Holder]:
    """Every live process that holds one of `gpus` (default: all in `states`).

    `states` should cover every GPU NVML sees: NVML's process lists are the per-GPU truth, and a
    device file alone is not. The CUDA driver opens /dev/nvidiaN of every GPU on the host whatever
    CUDA_VISIBLE_DEVICES says (measured on an H200 pair: a process limited to GPU 1 held fds on
    /dev/nvidia0 and /dev/nvidia1; NVML listed it on GPU 1 only). So an fd on a GPU's device file
    makes a holder of that GPU only for a process NVML lists on no GPU at all: an NVML reader, or a
    process whose PID NVML reports from another PID namespace. Such a holder, neither owned nor
    protected, is an observer (measured on an H200: `nvidia-smi dmon` and a process that only
    called nvmlInit both hold /dev/nvidia0 with no context); the handoff still fails closed on the
    GPU's memory.

    `open_files`: a /proc pass (device_file_holders) taken moments before, reused instead of a new one;
    its PIDs that have exited since are dropped."""
    wanted = set(gpus) if gpus is not None else {s.index for s in states}
    holders: dict[int, Holder] = {}
    listed: dict[int, set[int]] = {}  # pid -> GPUs NVML lists it on, across all GPUs

    def get(pid: int) -> Holder:
        return holders.setdefault(pid, Holder(pid=pid))

    for s in states:
        for p in s.processes:
            listed.setdefault(p.pid, set()).add(s.index)
            if s.index not in wanted:
                continue
            info = procfs.read_stat(p.pid)
            if info is not None and info.zombie:
                continue  # a zombie has already released its GPU memory; NVML will drop it
            h = get(p.pid)
            h.gpus.add(s.index)
            h.via.add(f"nvml-{p.kind}")
            if p.used_mib is not None:
                h.used_mib = (h.used_mib or 0) + p.used_mib
    paths = device_paths([s for s in states if s.index in wanted], dev_dir)
    if open_files is None:
        open_files = _open_device_files(paths)
    else:
        open_files = {path: {p for p in pids if (info := procfs.read_stat(p)) is not None and not info.zombie}
                      for path, pids in open_files.items()}
    if paths:
        for path, pids in open_files.items():
            if path not in paths:
                continue
            for pid in pids:
                gpu = paths[path]
                if pid in listed and gpu not in listed[pid]:
                    continue  # a CUDA process of another GPU: the driver opens every device file
                h = get(pid)
                h.gpus.add(gpu)
                h.via.add("fd")
    for h in holders.values():
        info = procfs.read_stat(h.pid)
        h.comm = info.comm if info else ""
        h.start_ticks = info.start_ticks if info else None
        h.cmd = describe_cmd(h.pid)
        h.cls, h.why = ownership.classify(h.pid)
        if h.cls == "foreign" and h.via == {"fd"} and info is not None:
            h.cls, h.why = "observer", OBSERVER_WHY
    return holders


def port_holders(ports: Iterable[int], ownership: Ownership) -> list[dict]:
    """Every listener on `ports`, with its PID, command and class (owned/protected/foreign)."""
    found = []
    listening = procfs.listening_sockets(set(ports))
    owners = procfs.socket_pids({i for inodes in listening.values() for i in inodes})
    for port, inodes in sorted(listening.items()):
        pids = sorted({pid for i in inodes for pid in owners.get(i, set())})
        if not pids:
            found.append({"port": port, "pid": None, "class": "foreign", "start_ticks": None,
                          "cmd": "", "why": "no visible process holds the socket"})
        for pid in pids:
            cls, why = ownership.classify(pid)
            found.append({"port": port, "pid": pid, "class": cls, "why": why, "cmd": describe_cmd(pid),
                          "start_ticks": procfs.start_ticks(pid)})
    return found
