"""What a benchmark result was measured with: what the config asks of the engine wherever the files lie,
the drafter's checksum, the target's fingerprint and the machine (GPU model, driver). The benchmark watch
(eagle3/bench/watch.py) compares results only between runs of the same drafter, and names any of these
that changed since the last good run."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..drafters.formats import PROVENANCE
from ..errors import PipelineError
from ..handoff.gpus import GpuState

DRAFTER_FILES = ("*.json", "*.safetensors")  # config, index and weights; not logs or optimizer states
CHUNK = 1 << 20


def serving_fingerprint(cfg) -> str:
    """What the benchmark asks of its engine: the target's settings, the bench section (what the watch never
    compares left out) and the environment the engine's servers get, hashed without anything that only says
    where a file lies (a Path, or a string of absolute paths such as a PYTHONPATH) and without the servers'
    addresses. The target, the drafter and the prompts are compared by content on their own; so a rerun from a
    checkout moved elsewhere asks the same, while a changed engine flag, variable or dtype does not."""
    exclude = dict(type(cfg.bench).FINGERPRINT_EXCLUDE, server={"host", "port"})
    data = {"target": cfg.target.model_dump(exclude={"data_parallel_size"}),
            "bench": cfg.bench.model_dump(exclude=exclude), "engine_env": getattr(cfg.engines, cfg.bench.engine).env}
    return hashlib.sha256(json.dumps(_without_locations(data), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _without_locations(value):
    if isinstance(value, dict):
        return {k: _without_locations(v) for k, v in value.items() if not _is_location(v)}
    if isinstance(value, (list, tuple)):
        return [_without_locations(v) for v in value if not _is_location(v)]
    return value


def _is_location(value) -> bool:
    return isinstance(value, Path) or (isinstance(value, str) and value != "" and
                                       all(os.path.isabs(part) for part in value.split(os.pathsep)))


def drafter_checksum(path: Path | str) -> str | None:
    """sha256 over the drafter's config and weight files (names and contents, sorted by name);
    None if the dir holds none. A re-export or a retrain changes it; a copy to another path does not."""
    files = sorted({f for pattern in DRAFTER_FILES for f in Path(path).glob(pattern)
                    if f.is_file() and f.name != PROVENANCE})
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0")
        with open(f, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()


def target_fingerprint(path: Path | str) -> str | None:
    """What identifies the target across reruns wherever its dir lies (a new checkout, another mount): sha256
    over its files' names and sizes, the whole of each file up to 1 MiB (config, tokenizer) and the first and
    last MiB of each larger one (weights: a fine-tune of the same shapes changes them). None if the dir holds
    no file. Cheap where hashing every weight would not be: a 70B target is 140 GB."""
    root = Path(path)
    files = sorted(f for f in root.iterdir() if f.is_file()) if root.is_dir() else []
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(CHUNK))
            if size > 2 * CHUNK:
                fh.seek(size - CHUNK)
                h.update(fh.read(CHUNK))
            elif size > CHUNK:
                h.update(fh.read())
    return h.hexdigest()


def platform(gpus: list[int]) -> dict:
    """The accelerator the numbers came from: {"device": "cpu"} on a CPU rehearsal, else the GPU
    names and the driver version as NVML reports them (None where NVML is unavailable)."""
    if not gpus:
        return {"device": "cpu", "gpu_names": [], "driver": None}
    from ..handoff.gpus import NvmlBackend

    try:
        backend = NvmlBackend()
    except PipelineError:
        return {"device": "gpu", "gpu_names": None, "driver": None}
    try:
        states: list[GpuState] = backend.snapshot(gpus)
        driver = backend.describe().removeprefix("NVML, driver ")
    except PipelineError:
        states, driver = [], None
    finally:
        backend.close()
    return {"device": "gpu", "gpu_names": [s.name for s in states] or None, "driver": driver}
