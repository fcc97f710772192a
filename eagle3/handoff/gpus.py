"""What NVML says about the GPUs: identity, v2 memory, utilisation and every process list.

The handoff trusts only what it can verify. A missing NVML library or driver is `NvmlUnavailable`
("cannot verify"), never "free"; a failing query (no permission, GPU lost) is `GpuQueryError`.
Memory is read with the v2 struct: v1 `used` includes the driver's reservation (~0.6 GiB on an
idle H200), so only v2 `used` can be compared with a threshold of a few MiB.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from ..errors import PipelineError

MIB = 1024 * 1024


class NvmlUnavailable(PipelineError):
    """No NVML library or no NVIDIA driver: GPU state cannot be verified."""


class GpuQueryError(PipelineError):
    """NVML answered with an error for a GPU (no permission, GPU lost, reset required, ...)."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    kind: str  # "compute", "graphics" or "mps"
    used_mib: float | None  # None where the driver cannot attribute memory to the process


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    name: str
    minor: int | None  # N of /dev/nvidiaN, which ties an fd scan back to this GPU
    pci_bus_id: str
    total_mib: float
    used_mib: float
    reserved_mib: float
    free_mib: float
    util_gpu: int | None
    util_mem: int | None
    processes: tuple[GpuProcess, ...] = field(default_factory=tuple)

    def device_file(self, dev_dir: Path) -> Path | None:
        return None if self.minor is None else Path(dev_dir) / f"nvidia{self.minor}"

    def to_dict(self) -> dict:
        return asdict(self)


class GpuBackend(Protocol):
    """Source of GPU snapshots. NvmlBackend in production; tests use a fake with this interface."""

    def count(self) -> int: ...

    def snapshot(self, indices: Sequence[int] | None = None) -> list[GpuState]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


def _mib(n: int) -> float:
    return round(n / MIB, 1)


class NvmlBackend:
    """pynvml behind the GpuBackend interface. Init and shutdown are reference counted by NVML."""

    def __init__(self):
        try:
            import pynvml
        except ImportError as e:
            raise NvmlUnavailable(f"the nvidia-ml-py package is not installed ({e})") from None
        self.nv = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML could not start: {e} (no NVIDIA driver on this host?)") from None
        self._closed = False

    def describe(self) -> str:
        nv = self.nv
        try:
            driver = nv.nvmlSystemGetDriverVersion()
        except nv.NVMLError:
            driver = "?"
        return f"NVML, driver {driver.decode() if isinstance(driver, bytes) else driver}"

    def count(self) -> int:
        try:
            return self.nv.nvmlDeviceGetCount()
        except self.nv.NVMLError as e:
            raise GpuQueryError(f"NVML cannot count GPUs: {e}") from None

    def snapshot(self, indices: Sequence[int] | None = None) -> list[GpuState]:
        total = self.count()
        wanted = list(range(total)) if indices is None else list(indices)
        missing = [i for i in wanted if not 0 <= i < total]
        if missing:
            raise GpuQueryError(f"GPU index {missing} not present: NVML sees {total} GPU(s) (0..{total - 1})")
        return [self._state(i) for i in wanted]

    def _state(self, index: int) -> GpuState:
        nv = self.nv

        def ask(what: str, fn, *args, optional: bool = False):
            try:
                return fn(*args)
            except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
                if optional:
                    return None
                raise GpuQueryError(f"GPU {index}: {what} is not supported by this driver") from None
            except nv.NVMLError as e:
                hint = ""
                if isinstance(e, (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired)):
                    hint = " (the GPU needs a reset or the node a drain/reboot)"
                raise GpuQueryError(f"GPU {index}: NVML {what} failed: {e}{hint}") from None

        h = ask("handle", nv.nvmlDeviceGetHandleByIndex, index)
        mem = ask("v2 memory info", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
        util = ask("utilization", nv.nvmlDeviceGetUtilizationRates, h, optional=True)
        procs: list[GpuProcess] = []
        for kind, fn in (("compute", nv.nvmlDeviceGetComputeRunningProcesses),
                         ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
                         ("mps", nv.nvmlDeviceGetMPSComputeRunningProcesses)):
            for p in ask(f"{kind} process list", fn, h, optional=(kind != "compute")) or []:
                used = getattr(p, "usedGpuMemory", None)
                procs.append(GpuProcess(pid=int(p.pid), kind=kind, used_mib=None if used is None else _mib(used)))
        pci = ask("PCI info", nv.nvmlDeviceGetPciInfo, h)
        return GpuState(
            index=index,
            uuid=_text(ask("UUID", nv.nvmlDeviceGetUUID, h)),
            name=_text(ask("name", nv.nvmlDeviceGetName, h)),
            minor=ask("minor number", nv.nvmlDeviceGetMinorNumber, h, optional=True),
            pci_bus_id=_text(pci.busId),
            total_mib=_mib(mem.total), used_mib=_mib(mem.used), reserved_mib=_mib(mem.reserved),
            free_mib=_mib(mem.free),
            util_gpu=None if util is None else int(util.gpu),
            util_mem=None if util is None else int(util.memory),
            processes=tuple(procs),
        )

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.nv.nvmlShutdown()
            except self.nv.NVMLError:
                pass

    def __enter__(self) -> "NvmlBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_sampler(backend_factory: Callable[[], GpuBackend] = NvmlBackend) -> Callable[[list[int]], list[GpuState] | None]:
    """The hang watchdog's GPU reading: the states of the given GPUs (v2 used memory, utilisation),
    or None when they cannot be read (then silence alone never ends a service; its budget does).
    One lazy NVML session per process, shared by every watchdog."""
    lock = threading.Lock()
    holder: dict[str, GpuBackend] = {}

    def sample(indices: list[int]) -> list[GpuState] | None:
        with lock:
            try:
                backend = holder.get("b") or holder.setdefault("b", backend_factory())
                return backend.snapshot(indices)
            except PipelineError:
                return None

    return sample


# The watchdog reading the pipeline's supervisor uses where GPUs are configured.
gpu_memory_sample = gpu_sampler()
