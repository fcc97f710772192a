"""Purging leftovers from /dev/shm without breaking anything that still uses them.

A file is removed only if every condition holds: its name matches the allow-list of segment
names that NCCL, Python multiprocessing and PyTorch create, and each registered engine's own; it belongs to the
pipeline's user; it is a regular file (lstat, never a link); no live process has it open or
mapped (unlinking a mapped segment kills its user with SIGBUS); and where the name embeds the
creator's PID, that process is gone. The open/mapped scan is repeated right before unlinking.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .. import engine_registry
from ..errors import ConfigError
from ..process import procfs

# Names from docs/FACTS.md §6 that no one engine owns; each engine adds its own (Engine.shm_patterns and
# shm_creator_pid, which the handoff passes in). Anchored globs: "vllm*" does not match "my-vllm".
PATTERNS = (
    "nccl-*",                     # NCCL (nccl-XXXXXX, older nccl-shm-recv-/send-)
    "psm_*",                      # multiprocessing.shared_memory (vLLM shm_broadcast, SGLang)
    "sem.mp-*",                   # multiprocessing semaphores
    "sem.loky-*",                 # joblib/loky semaphores
    "torch_*",                    # PyTorch file_system sharing strategy
    "kvcached_*",                 # kvcached
)

# Names that embed their creator's PID; a live creator means the segment may still be in use.
CREATOR_PID = (r"^torch_(\d+)_", r"^sem\.loky-(\d+)-")


def names_with_engines() -> dict[str, tuple[str, ...]]:
    """purge's patterns and creator-PID regexes: everyone's and each registered engine's. An engine that cannot be
    loaded (a plugin gone) adds nothing, so its segments are kept: never removed on a guess."""
    patterns, creators = PATTERNS, CREATOR_PID
    for name in engine_registry.names():
        with contextlib.suppress(ConfigError):
            engine = engine_registry.get(name)
            patterns, creators = patterns + engine.shm_patterns, creators + engine.shm_creator_pid
    return {"patterns": patterns, "creator_pid": creators}


@dataclass
class ShmResult:
    removed: list[str] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)  # {"name", "reason"}; only allow-listed names
    free_bytes: int | None = None
    error: str = ""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _creator_pid(name: str, creator_pid: tuple[str, ...]) -> int | None:
    for rx in creator_pid:
        m = re.match(rx, name)
        if m:
            return int(m.group(1))
    return None


def _in_use(shm_dir: str) -> dict[tuple[int, int], set[int]]:
    return procfs.open_inodes_under(shm_dir.rstrip("/") + "/")


def purge(shm_dir: Path, uid: int | None = None, patterns: tuple[str, ...] = PATTERNS,
          creator_pid: tuple[str, ...] = CREATOR_PID) -> ShmResult:
    result = ShmResult()
    uid = os.getuid() if uid is None else uid
    real_dir = os.path.realpath(shm_dir)
    try:
        names = sorted(os.listdir(real_dir))
    except FileNotFoundError:
        result.error = f"{shm_dir} does not exist"
        return result
    candidates: list[str] = []
    in_use = _in_use(real_dir)
    for name in names:
        if not any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
            continue
        path = os.path.join(real_dir, name)
        reason = _keep_reason(path, name, uid, in_use, creator_pid)
        if reason:
            result.kept.append({"name": name, "reason": reason})
        else:
            candidates.append(name)
    if candidates:
        in_use = _in_use(real_dir)  # fresh scan: something may have opened a file meanwhile
        for name in candidates:
            path = os.path.join(real_dir, name)
            reason = _keep_reason(path, name, uid, in_use, creator_pid)
            if reason:
                result.kept.append({"name": name, "reason": reason})
                continue
            try:
                os.unlink(path)
                result.removed.append(name)
            except FileNotFoundError:
                pass
            except OSError as e:
                result.kept.append({"name": name, "reason": f"unlink failed: {e.strerror}"})
    try:
        st = os.statvfs(real_dir)
        result.free_bytes = st.f_bavail * st.f_frsize
    except OSError:
        pass
    return result


def _keep_reason(path: str, name: str, uid: int, in_use: dict[tuple[int, int], set[int]],
                 creator_pid: tuple[str, ...]) -> str:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "gone"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not the pipeline's uid {uid}"
    users = in_use.get((st.st_dev, st.st_ino))
    if users:
        return f"open or mapped by PID {', '.join(map(str, sorted(users)))}"
    creator = _creator_pid(name, creator_pid)
    if creator is not None and procfs.alive(creator):
        return f"its creator PID {creator} is alive"
    return ""
