"""Purging stale bytecode of patched packages (handoff.pycache_dirs).

A patch that keeps the source's mtime and size (cp -p, some rsync/git modes) leaves CPython
loading the old .pyc. Each configured path is either a `__pycache__` directory or a package
directory whose `__pycache__` directories are purged recursively. Only *.pyc/*.pyo files inside
directories named __pycache__ are removed; links are never followed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class PycacheResult:
    removed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _purge_cache_dir(d: str, result: PycacheResult) -> None:
    for name in os.listdir(d):
        path = os.path.join(d, name)
        if name.endswith((".pyc", ".pyo")) and os.path.isfile(path) and not os.path.islink(path):
            os.unlink(path)
            result.removed.append(path)
    try:
        os.rmdir(d)  # only if now empty
    except OSError:
        pass


def purge(dirs: list[Path]) -> PycacheResult:
    result = PycacheResult()
    for root in map(str, dirs):
        if not os.path.isdir(root) or os.path.islink(root):
            result.missing.append(root)
            continue
        if os.path.basename(root.rstrip("/")) == "__pycache__":
            _purge_cache_dir(root, result)
            continue
        for here, subdirs, _ in os.walk(root, followlinks=False):
            if "__pycache__" in subdirs:
                subdirs.remove("__pycache__")
                cache = os.path.join(here, "__pycache__")
                if not os.path.islink(cache):
                    _purge_cache_dir(cache, result)
    return result
