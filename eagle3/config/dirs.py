"""Where the pipeline may write: a directory it creates, replaces and deletes must be its own."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import echo
from ..inputfiles import dir_problem

# ---- where the pipeline writes -----------------------------------------------------------------

CHECKOUT = Path(__file__).resolve().parents[2]
_SOURCE_DIRS = ("eagle3", "flows", "tasks", "tests", "configs", "deployments", "scripts", "docs", "bench", ".git")
_SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media", "/mnt",
                "/opt", "/proc", "/root", "/run", "/sbin", "/snap", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/tmp",
                "/var/lib", "/var/log", "/var/cache", "/usr/local")
_SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr")
_OWN_DIR = ("the pipeline creates, replaces and deletes phase directories in run_dir: give it a directory of its "
            "own, e.g. /data/eagle3/runs/NAME or runs/NAME next to the config")


def _within(path: Path, top: str | Path) -> bool:
    tops = {Path(top), Path(os.path.realpath(top))}
    return any(path == t or t in path.parents for t in tops)


def owned_dir_problem(path: Path, writable: bool = True, purpose: str = _OWN_DIR) -> str | None:
    """Why the pack may not own the directory `path` (run_dir, or an output a command replaces), or
    None: not a system directory or tree, not $HOME or above it, not the pack's checkout or above
    it, not inside its sources, a directory (or creatable as one), and writable (`writable`:
    checked only where the writing will happen). `purpose` ends each message with the why and fix."""
    if "\x00" in str(path):
        return f"{echo(str(path))} is not a valid path (it holds a NUL character)"
    real = Path(os.path.realpath(path))
    home = Path(os.path.realpath(os.path.expanduser("~")))
    shown = str(path) if real == Path(path) else f"{path} (= {real})"
    if real == home:
        return f"{shown} is your home directory; {purpose}"
    if any(real == Path(d) or real == Path(os.path.realpath(d)) for d in _SYSTEM_DIRS):
        return f"{shown} is a system directory; {purpose}"
    tree = next((t for t in _SYSTEM_TREES if _within(real, t)), None)
    if tree:
        return f"{shown} is inside the system tree {tree}; {purpose}"
    if real in home.parents:
        return f"{shown} holds your home directory ({home}); {purpose}"
    if real == CHECKOUT or real in CHECKOUT.parents:
        return f"{shown} holds the pack's own checkout ({CHECKOUT}); {purpose}"
    source = next((d for d in _SOURCE_DIRS if _within(real, CHECKOUT / d)), None)
    if source:
        return f"{shown} is inside the pack's source tree ({CHECKOUT / source}); {purpose}"
    existing = next(p for p in (real, *real.parents) if os.path.lexists(p))
    why = dir_problem(existing)
    if why:
        return (f"{shown} {why}; {purpose}" if existing == real else
                f"{shown} cannot be created: {existing} {why}; {purpose}")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        return f"{shown} is not writable ({existing}: permission denied); {purpose}"
    return None

