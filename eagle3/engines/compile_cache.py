"""The pack's own compile cache: what a server compiles while it starts (vLLM's torch.compile
artefacts, Inductor's and Triton's kernels), kept across starts and reruns in one directory per key.

The key is everything such an artefact depends on that the pack can see: the engine and its probed
package versions, the target (its config.json, each weight file's name, size and mtime), any drafter
the flags name (the same), the server's flags except where it listens and what it is called, the
variables the config sets for the engine, and the GPUs' names. Another model, engine version or flag
set gets another directory, so a start never reads what a different server compiled; the engine's own
cache checks come on top of that. With no probed version there is no key, and the server compiles in
a directory of its own start (nothing reused, nothing left in a shared /tmp).

What does not depend on the flags is shared by every key of one engine version, in
`<engine>/shared-<versions hash>/`: vLLM's answers to "what can this model class do", keyed by vLLM
itself by the model's source file, which it otherwise gets from a subprocess that imports torch and vLLM
again (a second one for a drafter's class): 7 of a 22 s start of the tiny model on the 2-core CPU box
(bench/modelinfo_share_bench.py); on the H200 machine the API server's own imports took 14-25 s.

Where: `$XDG_CACHE_HOME/eagle3/compile/<engine>/<key>/` when that is provably the user's own (so a
second run dir of the same model reuses it), else the run dir's `state/compile-cache/`. Never
Inductor's and Triton's default under /tmp, where another local user could plant kernels first.
`engines.<name>.compile_cache: false` leaves the engine's own defaults alone."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .. import owned
from ..fsio import atomic_write_json

# Flags whose value never changes what a server compiles: where it listens and the name it answers to.
_UNKEYED_FLAGS = ("--host", "--port", "--served-model-name")
KEY_FILE = "key.json"


@dataclass
class CacheDir:
    path: Path
    key: str
    reused: bool  # an earlier start of the same key finished with this directory
    busy: bool = False  # the key's directory was another start's at the time: this one compiled apart
    # Beside the keys, one directory per engine version for what does not depend on a start's flags
    # (the engine adapter's share_across_keys says what goes there); None without a probed version.
    shared: Path | None = None
    material: dict | None = field(default=None, repr=False)  # what the key hashes; KEY_FILE's content
    lock_fd: int | None = field(default=None, repr=False)  # held while this start owns the key's directory

    def record(self) -> dict:
        return {"dir": str(self.path), "key": self.key, "reused": self.reused, "busy": self.busy,
                "shared": None if self.shared is None else str(self.shared)}

    def close(self, ready: bool) -> None:
        """Let the next start of the key in; once this one's server was ready (its compile done), mark the
        directory complete, which later starts report as reused. A scratch directory is never marked."""
        if self.lock_fd is None:
            return
        try:
            if ready and not self.reused:
                atomic_write_json(self.path / KEY_FILE, self.material)
        finally:
            os.close(self.lock_fd)
            self.lock_fd = None


def model_identity(model: Path) -> dict:
    """config.json's hash and each weight file's (size, mtime): a remade or edited model is another key."""
    model = Path(model)
    if not model.is_dir():
        return {"path": str(model)}
    config = model / "config.json"
    weights = sorted(p for p in model.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".gguf"))
    return {"config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
            "weights": [[p.name, (st := p.stat()).st_size, st.st_mtime_ns] for p in weights]}


def _keyed_argv(argv: list[str]) -> list[str]:
    """The server's flags less the launcher and the unkeyed flags' values."""
    out, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _UNKEYED_FLAGS:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def _drafters(argv: list[str]) -> dict[str, dict]:
    """The identity of each model a JSON flag value names (a speculative config's drafter)."""
    found = {}
    for arg in argv:
        if arg.startswith("{"):
            try:
                value = json.loads(arg)
            except ValueError:
                continue
            if isinstance(value, dict) and isinstance(value.get("model"), str):
                found[value["model"]] = model_identity(Path(value["model"]))
    return found


def key_material(engine: str, versions: dict, argv: list[str], env: dict[str, str], model: Path,
                 gpu_names: list[str]) -> dict:
    return {"engine": engine, "versions": dict(sorted(versions.items())), "argv": _keyed_argv(argv),
            "env": dict(sorted(env.items())), "model": model_identity(model), "drafters": _drafters(argv),
            "gpus": list(gpu_names)}


def cache_key(material: dict) -> str:
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]


def user_root() -> Path | None:
    """The user's compile cache root, or None where it is not provably the user's own."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3"
    try:
        owned.private_dir(base, "the pack's cache directory")
        return owned.private_dir(base / "compile", "the pack's compile cache")
    except (OSError, owned.NotOwned):
        return None


def prepare(root: Path, engine: str, material: dict | None, scratch: Path) -> CacheDir:
    """The directory this start compiles into: the key's, created 0700 under `root` and held until
    `close()`; with no key material, or while another start holds the key, `scratch` (the run's own,
    emptied first: nothing reused)."""
    if material is None:
        shutil.rmtree(scratch, ignore_errors=True)
        return CacheDir(owned.private_dir(scratch, "a server's compile directory"), "", False)
    shared = shared_dir(root, engine, material["versions"])
    engine_dir = shared.parent
    key = cache_key(material)
    path = owned.private_dir(engine_dir / key, "a server's compile directory")
    # One start at a time per key (two shards on one node, two runs of one model): a second start while
    # the first still compiles would write the same files; it compiles apart instead and reuses nothing.
    fd = os.open(path / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        owned.check_stat(os.fstat(fd), path / ".lock", "a compile directory's lock")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        shutil.rmtree(scratch, ignore_errors=True)
        return CacheDir(owned.private_dir(scratch, "a server's compile directory"), key, False, busy=True,
                        shared=shared)
    except BaseException:
        os.close(fd)
        raise
    return CacheDir(path, key, (path / KEY_FILE).is_file(), material=material, lock_fd=fd, shared=shared)


def shared_dir(root: Path, engine: str, versions: dict) -> Path:
    """The directory every key of one engine version shares (created 0700 under `root`)."""
    root = owned.private_dir(root, "the pack's compile cache")
    engine_dir = owned.private_dir(root / engine, "the pack's compile cache")
    return owned.private_dir(engine_dir / f"shared-{cache_key({'versions': versions})[:16]}",
                             "the pack's compile cache")


def gpu_names(indices: list[int]) -> list[str]:
    """The names of the GPUs a server gets (compiled kernels are per architecture); [] without NVML."""
    from ..handoff.gpus import GpuQueryError, NvmlBackend, NvmlUnavailable
    try:
        with NvmlBackend() as nvml:
            return [g.name for g in nvml.snapshot(indices)]
    except (NvmlUnavailable, GpuQueryError):
        return []
