"""A GPU backend for machines without one, behind the same interface as NvmlBackend.

Each fake GPU is a real file `nvidia<minor>` in a temp dev_dir. What the fake reports follows real
process state: a live process with that file open or mapped counts as a CUDA context on that GPU
(listed as a compute process, `mib_per_holder` MiB used), so memory is "released" exactly when
the holding process is gone, as the driver does. `contexts[pid]` narrows where a process has a
context, as CUDA_VISIBLE_DEVICES does while the driver still opens every GPU's device file (an
empty set: an NVML reader with no context). `stuck_mib` simulates memory held with no process
(a wedged GPU); `error` makes every query fail like a lost GPU. `linger_s` keeps a gone holder's
memory counted (with no process listed) for that long after a query first finds it gone, as the
driver takes a moment to free a killed context's memory (0.04-0.1 s on an H200, docs/FACTS.md)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Sequence

from eagle3.process import procfs
from eagle3.handoff.gpus import GpuProcess, GpuQueryError, GpuState

TOTAL_MIB = 143771.0
RESERVED_MIB = 615.0


class FakeGpuBackend:
    def __init__(self, dev_dir: Path, count: int = 2, mib_per_holder: float = 512.0, linger_s: float = 0.0):
        self.dev_dir = Path(dev_dir)
        self.linger_s = linger_s
        self._seen: dict[tuple[int, int], float | None] = {}  # (gpu, pid) -> when first found gone
        self.dev_dir.mkdir(parents=True, exist_ok=True)
        self.mib_per_holder = mib_per_holder
        self.stuck_mib = [0.0] * count
        self.util = [0] * count
        self.error: str | None = None
        self.contexts: dict[int, set[int]] = {}
        self.snapshots = 0
        for i in range(count):
            (self.dev_dir / f"nvidia{i}").write_bytes(b"\0" * 4096)  # mappable, like a device node
        (self.dev_dir / "nvidiactl").write_bytes(b"")

    def device(self, index: int) -> Path:
        return self.dev_dir / f"nvidia{index}"

    def count(self) -> int:
        return len(self.stuck_mib)

    def describe(self) -> str:
        return f"fake GPUs in {self.dev_dir}"

    def snapshot(self, indices: Sequence[int] | None = None) -> list[GpuState]:
        self.snapshots += 1
        if self.error:
            raise GpuQueryError(self.error)
        wanted = list(range(self.count())) if indices is None else list(indices)
        bad = [i for i in wanted if not 0 <= i < self.count()]
        if bad:
            raise GpuQueryError(f"GPU index {bad} not present")
        paths = {os.path.realpath(self.device(i)): i for i in wanted}
        users = procfs.all_open_paths(lambda p: p in paths, needle=os.path.realpath(self.dev_dir))
        states = []
        for i in wanted:
            pids = sorted(p for p in users.get(os.path.realpath(self.device(i)), set())
                          if i in self.contexts.get(p, {i}))
            used = self.stuck_mib[i] + self.mib_per_holder * (len(pids) + self._lingering(i, pids))
            states.append(GpuState(
                index=i, uuid=f"GPU-fake-{i:04d}", name="Fake H200", minor=i, pci_bus_id=f"00000000:{i + 0x10:02X}:00.0",
                total_mib=TOTAL_MIB, used_mib=used, reserved_mib=RESERVED_MIB,
                free_mib=TOTAL_MIB - RESERVED_MIB - used, util_gpu=self.util[i], util_mem=0,
                processes=tuple(GpuProcess(pid=p, kind="compute", used_mib=self.mib_per_holder) for p in pids)))
        return states

    def _lingering(self, gpu: int, pids: list[int]) -> int:
        now = time.monotonic()
        for pid in pids:
            self._seen[(gpu, pid)] = None
        for key, gone_at in list(self._seen.items()):
            if key[0] == gpu and key[1] not in pids and gone_at is None:
                self._seen[key] = now
        return sum(1 for (g, _), gone_at in self._seen.items()
                   if g == gpu and gone_at is not None and now - gone_at < self.linger_s)

    def close(self) -> None:
        pass
