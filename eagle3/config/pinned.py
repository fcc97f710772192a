"""One validated config per run. The config a run starts with is pinned in the run's state
(`state/configs/<run id>.yaml`), and every task, shard, handoff and retry of that run reads the pinned
copy, never the YAML again: an edit to the YAML while a run goes on changes the next run, not this one.

A pinned copy is itself a config file: the mapping as validated, every path already absolute, under a
header that says where it came from. `load_config` reads it through the same validation as any config,
so it yields the same model and the same fingerprints (and the cache keys and done markers built on
them). A run that starts from an edited YAML says which phases' fingerprints changed since the run
before it, and which keys."""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import owned, phase_table, safe_yaml
from ..errors import echo
from ..fsio import atomic_write_text
from .loading import (PINNED, load_config, parse_mapping, read_config_bytes, read_mapping, remember,
                      resolved_mapping, validated)
from .model import PipelineConfig

SCHEMA = 1
KEEP = 50  # pinned copies kept per run dir; the oldest go first (each is a few KB)
_SECRET = "api_key"  # a key whose value is never echoed in a change line


@dataclass
class Pinned:
    cfg: PipelineConfig
    path: Path  # the pinned copy every reader of this run is given
    changes: list[str] = field(default_factory=list)  # against the run dir's previous run, when this one is new


def is_pinned(path: Path | str) -> bool:
    raw = read_mapping(Path(path))
    return isinstance(raw, dict) and PINNED in raw


def pin(config_path: Path | str, run_id: str, check_files: bool = True) -> Pinned:
    """The config run `run_id` reads from now on. A pinned copy is returned as it is (a shard, a run
    handed its copy); a run that already pinned one (a retry of the same flow run) gets its own copy
    back, whatever the YAML says now; otherwise the YAML is validated and pinned."""
    path = Path(config_path)
    data = read_config_bytes(path)  # one read: what is pinned is what was validated
    raw = parse_mapping(data, path)
    cfg = validated(path, data, check_files)  # the entry point's validation of these bytes, when it made one
    if isinstance(raw, dict) and PINNED in raw:
        return Pinned(cfg, path)
    target = cfg.layout.pinned_config(run_id)
    if target.is_file():
        owned.read_bytes(target, what="the run's pinned config")  # ours, not a link: NotOwned otherwise
        return Pinned(load_config(target, check_files), target)
    body = resolved_mapping(copy.deepcopy(raw), path.resolve().parent)
    previous = latest(cfg.layout.pinned_configs)
    if previous:
        owned.read_bytes(previous, what="the run dir's last pinned config")
    fingerprints = {p: cfg.fingerprint(p) for p in phase_table.names()}
    changes = changed(previous, body, fingerprints) if previous else []
    header = {"schema": SCHEMA, "source": str(path.resolve()), "run_id": run_id, "pinned_at": time.time(),
              "fingerprints": fingerprints}
    text = safe_yaml.dump({PINNED: header, "config": body})
    atomic_write_text(target, text)
    os.chmod(target, 0o600)  # it may hold an inline api_key, as the YAML it copies does
    remember(target, text.encode(), cfg, check_files)  # every reader of the copy in this process: this model
    _prune(cfg.layout.pinned_configs, keep=target)
    return Pinned(cfg, target, changes)


def latest(directory: Path) -> Path | None:
    """The run dir's most recently pinned copy."""
    copies = sorted(directory.glob("*.yaml"), key=lambda p: p.stat().st_mtime_ns) if directory.is_dir() else []
    return copies[-1] if copies else None


def changed(previous: Path, new: dict, fingerprints: dict[str, str]) -> list[str]:
    """Per phase whose fingerprint differs from the previous run's (as its pinned copy's header recorded
    them: nothing is validated again): the phase, both fingerprints and the keys that differ (values
    shown, never a secret's)."""
    try:
        raw = read_mapping(previous)
    except Exception:  # noqa: BLE001 - an unreadable old copy (another schema): nothing to compare with
        return []
    header, old = (raw.get(PINNED), raw.get("config")) if isinstance(raw, dict) else (None, None)
    before = header.get("fingerprints") if isinstance(header, dict) else None
    if not isinstance(old, dict) or not isinstance(before, dict):
        return []
    diffs = _diff(old, new)
    lines = []
    for phase in phase_table.names():
        a, b = before.get(phase), fingerprints[phase]
        if a != b:
            keys = [d for d in diffs if d.split(":", 1)[0].split(".", 1)[0] in (phase, "target")]
            lines.append(f"{phase}: config fingerprint {a} -> {b}" + (f" ({'; '.join(keys)})" if keys else ""))
    return lines


def _diff(old, new, where: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            inner = f"{where}.{key}" if where else str(key)
            out += _diff(old.get(key), new.get(key), inner)
        return out
    if old == new:
        return []
    if _SECRET in where:
        return [f"{where}: changed"]
    return [f"{where}: {echo(old, 60)} -> {echo(new, 60)}"]


def _prune(directory: Path, keep: Path) -> None:
    copies = sorted(directory.glob("*.yaml"), key=lambda p: p.stat().st_mtime_ns)
    for old in copies[:-KEEP]:
        if old != keep:
            old.unlink(missing_ok=True)
