"""When a supervised process is ready (probes) and when it has hung (the watchdog: no log growth,
no readiness or output progress, and on GPU nodes no movement of GPU memory)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, Protocol

LAUNCH_MARKER = "==> eagle3: launching "  # the line the supervisor writes into a log before each launch


class Probe(Protocol):
    def ready(self) -> bool: ...
    def describe(self) -> str: ...


class HttpProbe:
    """Ready on the expected status; a refused or timed-out connection means "still starting"."""

    def __init__(self, url: str, status: int = 200, headers: dict[str, str] | None = None):
        self.url, self.status, self.headers = url, status, headers or {}

    def ready(self) -> bool:
        import httpx

        try:
            return httpx.get(self.url, timeout=2.0, headers=self.headers).status_code == self.status
        except httpx.HTTPError:
            return False

    def describe(self) -> str:
        return f"GET {self.url} -> {self.status}"


class LogProbe:
    """Ready once the current launch's part of the log has a line matching `pattern`.

    Logs are appended to across relaunches (retries keep the earlier attempts' output), so text
    before the last launch marker is never matched: an old "ready" line must not pass a new launch."""

    FIRST_READ = 1 << 20

    def __init__(self, log: Path, pattern: str):
        self.log, self.regex = Path(log), re.compile(pattern, re.MULTILINE)
        self._offset: int | None = None
        self._carry = ""
        self._seen = False

    def ready(self) -> bool:
        if self._seen:  # sticky: the line may scroll out of what is re-read while other probes wait
            return True
        try:
            with open(self.log, "rb") as fh:
                if self._offset is None:
                    fh.seek(0, os.SEEK_END)
                    self._offset = max(0, fh.tell() - self.FIRST_READ)
                fh.seek(self._offset)
                chunk = fh.read().decode(errors="replace")
                self._offset = fh.tell()
        except FileNotFoundError:
            return False
        text = self._carry + chunk
        cut = text.rfind(LAUNCH_MARKER)
        if cut >= 0:
            text = text[cut + len(LAUNCH_MARKER):]
        self._carry = text[-4096:]  # keeps a line split across two reads matchable
        self._seen = bool(self.regex.search(text))
        return self._seen

    def describe(self) -> str:
        return f"log line /{self.regex.pattern}/"


class Watchdog:
    """Declares a process hung when nothing it does has progressed for `silence_s`.

    Progress is any of: its log grows; one more readiness probe passes (a starting server); one of
    `paths` changes (a one-shot command's outputs, e.g. a trainer's checkpoints); where it has GPUs,
    their NVML used memory moves by MEM_STEP_MIB (a loading model allocates). Utilisation is no
    signal either way: in a deadlocked NCCL group one rank spins at 100 % in the collective the
    others never join, the others idle at 0 %, and all hold their memory still (measured on
    2 x H200). Where GPUs are configured but cannot be read, silence alone never ends the process
    (its startup budget or timeout still does). A phase that legitimately stays silent with
    constant memory (a long compile) needs hang_timeout_s above its length."""

    SAMPLE_S = 1.0  # GPUs and output paths are read at most this often (and once more before a verdict)
    MEM_STEP_MIB = 1.0

    def __init__(self, log: Path, silence_s: float | None, gpu_sample: Callable[[], list | None] | None = None,
                 paths: list[Path] | tuple = ()):
        self.log, self.silence_s, self.gpu_sample, self.paths = Path(log), silence_s, gpu_sample, list(paths)
        now = time.monotonic()
        self._log_size, self._log_since, self._since = -1, now, now
        self._ready, self._stamp, self._sampled_at = 0, _tree_stamp(self.paths), -float("inf")
        self._mem: tuple[float, ...] | None = None  # GPU memory at its last move
        self._mem_since = now
        self._gpus: list | None = None  # the last GPU reading (states with used_mib, util_gpu), None: unreadable

    def _sample(self, now: float) -> None:
        self._sampled_at = now
        stamp = _tree_stamp(self.paths)
        if stamp != self._stamp:
            self._stamp = stamp
            self._since = now
        if self.gpu_sample is None:
            return
        self._gpus = self.gpu_sample()
        if self._gpus is None:
            return
        mem = tuple(g.used_mib for g in self._gpus)
        if self._mem is None or len(mem) != len(self._mem) or any(
                abs(a - b) >= self.MEM_STEP_MIB for a, b in zip(mem, self._mem)):
            if self._mem is not None:
                self._since = now
            self._mem, self._mem_since = mem, now

    def hung(self, ready: int = 0) -> bool:
        """`ready`: how many readiness probes pass now (more than before is progress)."""
        if self.silence_s is None:
            return False
        now = time.monotonic()
        try:
            size = self.log.stat().st_size
        except FileNotFoundError:
            size = 0
        if size != self._log_size:
            self._log_size, self._log_since = size, now
            self._since = now
        if ready > self._ready:
            self._ready = ready
            self._since = now
        if now - self._sampled_at >= self.SAMPLE_S:
            self._sample(now)
        if now - self._since < self.silence_s:
            return False
        self._sample(now)  # a fresh reading before the verdict
        if now - self._since < self.silence_s:
            return False
        return self.gpu_sample is None or self._gpus is not None

    def describe(self) -> str:
        """What the verdict rests on, for the error message."""
        now = time.monotonic()
        parts = [f"no log output for {now - self._log_since:.0f} s"]
        if self._ready:
            parts.append(f"{self._ready} readiness probe(s) passing, no more since")
        if self.paths:
            parts.append(f"no change under {', '.join(map(str, self.paths))}")
        if self._gpus:
            used = "/".join(f"{g.used_mib:.0f}" for g in self._gpus)
            util = "/".join("?" if g.util_gpu is None else str(g.util_gpu) for g in self._gpus)
            parts.append(f"GPU memory unchanged for {now - self._mem_since:.0f} s on GPUs "
                         f"{[g.index for g in self._gpus]} ({used} MiB used; utilisation {util} %, "
                         "not a progress signal)")
        return ", ".join(parts)


def _tree_stamp(paths: list[Path], limit: int = 10_000) -> tuple[int, int, int]:
    """(files, bytes, newest mtime in ns) under `paths`: changes when anything there is written.
    Stops after `limit` files, so a huge output tree costs a bounded scan."""
    files = size = newest = 0
    todo = [str(p) for p in paths]
    while todo and files < limit:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    todo.append(e.path)
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            files, size, newest = files + 1, size + st.st_size, max(newest, st.st_mtime_ns)
    return files, size, newest
