"""What an engine environment itself says about itself, asked once per run dir.

The probe runs the engine's inspect_script (`engine_side/inspect_<engine>.py`) in the engine's own interpreter: its package
versions, whether it can capture EAGLE-3 hidden states from the target (without loading weights),
and which of the server flags the pack may pass its own `vllm serve` argument parser accepts.
Flags that exist in one vLLM release and not another are chosen from that answer, never from a
guessed version. Answers are cached per (interpreter, its env, target config) in the run dir, so
the doctor and a phase that needs one share a single probe. For a venv interpreter the answer is
also kept in the user's cache (`$XDG_CACHE_HOME/eagle3/engine-probes.json`), keyed by the venv's
site-packages as well (an install or upgrade changes its mtime), so new run dirs on the same engine
do not pay the engine's imports again; that file is read only when it is the user's own and not
writable by others.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from .. import owned
from ..config import PipelineConfig
from ..errors import CommandFailed, ConfigError
from ..fsio import atomic_write_json, file_lock, read_json
from ..process.services import LaunchSpec, Supervisor
from .. import engine_registry
from . import compile_cache

ENGINE_SIDE = Path(__file__).resolve().parent.parent / "engine_side"


def engine_probe(cfg: PipelineConfig, sup: Supervisor, engine: str, script: str, *args: str,
                 cached_only: bool = False, scratch_env: dict[str, str] | None = None) -> dict | None:
    """Run an engine-side script (`--out FILE` appended) and return the JSON it wrote; cached.
    `cached_only`: the cached answer, or None rather than running the script. `scratch_env`: variables
    for the script's run only, not part of the answer's key (where it leaves files beside its answer)."""
    env = getattr(cfg.engines, engine)
    key_src = json.dumps([env.python_argv(), env.env, script, args,
                          _interpreter_identity(env.python), (cfg.target.model / "config.json").read_text()],
                         default=str)
    # An install into the engine's venv changes its site-packages, not its interpreter: part of the key
    # for the run dir's cache too, or a rerun after `pip install -U vllm` would read the old answer.
    site = _site_packages_stamp(env.python)
    key = hashlib.sha256((key_src + (site or "")).encode()).hexdigest()[:16]
    user_key = hashlib.sha256((key_src + site).encode()).hexdigest()[:24] if site else None
    if (cached := _cached(cfg, key, user_key)) is not None or cached_only:
        return cached
    out = cfg.layout.doctor / f"{engine}-{Path(script).stem}.json"
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    # One asker of a probe at a time (the preflight's warm-up asks the engines in parallel threads): a second
    # asker of the same one waits, then reads the first one's answer instead of running it over its files.
    with file_lock(out.with_suffix(".lock")):
        if (cached := _cached(cfg, key, user_key)) is not None:
            return cached
        out.unlink(missing_ok=True)
        spec = LaunchSpec(name=f"doctor-{engine}", argv=[*env.python_argv(), str(ENGINE_SIDE / script), *args,
                                                         "--out", str(out)],
                          log=log, phase="doctor", env={**env.env, **(scratch_env or {})}, stop_grace_s=5,
                          hang_timeout_s=300)
        try:
            sup.run(spec, timeout_s=600)
        except CommandFailed:
            pass  # the script writes its error into the JSON; a missing JSON is reported below
        result = read_json(out, default=None) or {"error": f"probe wrote nothing; see {log}"}
        if "error" not in result:
            _remember(cfg, key, user_key, result)
    return result


def _cached(cfg: PipelineConfig, key: str, user_key: str | None) -> dict | None:
    """The run dir's answer, else the user's (copied into the run dir's cache), else None."""
    cache = read_json(cfg.layout.doctor_cache, default={})
    if key in cache:
        return cache[key]
    user_cache = _user_cache() if user_key else None
    if user_cache is not None and user_key in user_cache[1]:
        _remember(cfg, key, None, user_cache[1][user_key])
        return user_cache[1][user_key]
    return None


def _remember(cfg: PipelineConfig, key: str, user_key: str | None, answer: dict) -> None:
    """Add one answer to the run dir's cache (and the user's): read, add and replace under the cache's
    lock, so that answers written at once by parallel askers are all kept."""
    cache_path = cfg.layout.doctor_cache
    with file_lock(cache_path.with_suffix(".lock")):
        atomic_write_json(cache_path, {**read_json(cache_path, default={}), key: answer})
    if user_key is None or _user_cache() is None:  # the user's cache dir, made and proven the user's own first
        return
    with file_lock(_user_cache_dir() / "engine-probes.lock"):
        if (user_cache := _user_cache()) is not None:
            atomic_write_json(user_cache[0], {**user_cache[1], user_key: answer})


def inspect_engine(cfg: PipelineConfig, sup: Supervisor, engine: str, cached_only: bool = False) -> dict | None:
    """The engine's versions, its support for the target, and which of its optional_serve_flags it takes
    (`cached_only`: None where no probe has answered yet)."""
    adapter = engine_registry.get(engine)
    args = (adapter.inspect_script, str(cfg.target.model), *(f"--dist={dist}" for dist in adapter.distributions),
            *(f"--serve-flag={flag}" for flag in adapter.optional_serve_flags))
    cached = engine_probe(cfg, sup, engine, *args, cached_only=True)
    if cached is not None or cached_only:
        return cached
    if not getattr(cfg.engines, engine).compile_cache:
        return engine_probe(cfg, sup, engine, *args)
    # What the probe can work out for the servers' starts (vLLM: its model-inspection answers) lands in the
    # run's scratch, then in the compile cache's directory for this engine version, which every start reads.
    owned.private_dir(cfg.layout.doctor, "the run's doctor directory")
    scratch = Path(tempfile.mkdtemp(prefix=f"{engine}-for-starts-", dir=cfg.layout.doctor))  # 0700, this asker's own
    try:
        result = engine_probe(cfg, sup, engine, *args, scratch_env=adapter.probe_scratch_env(scratch))
        if isinstance(result.get("versions"), dict):
            root = compile_cache.user_root() or cfg.layout.compile_cache
            adapter.adopt_probe_output(scratch, compile_cache.shared_dir(root, engine, result["versions"]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return result


def import_errors(cfg: PipelineConfig, sup: Supervisor, engine: str, *modules: str) -> dict[str, tuple[str, str | None]]:
    """{module: (why, the top-level module not found or None)} for each of `modules` the engine's
    environment fails to import; {} if all import."""
    info = engine_probe(cfg, sup, engine, "import_check.py", *modules)
    answers, missing = info.get("imports"), info.get("missing") or {}
    if not isinstance(answers, dict):
        return {m: (info.get("error", "the import check gave no answer"), None) for m in modules}
    why = {m: answers.get(m, "the import check gave no answer") for m in modules}  # None: it imported
    return {m: (reason, missing.get(m)) for m, reason in why.items() if reason is not None}


def engine_accepts(cfg: PipelineConfig, sup: Supervisor, engine: str, flag: str) -> bool:
    """Whether the configured engine's own server parser has `flag` (one of its optional_serve_flags)."""
    if flag not in engine_registry.get(engine).optional_serve_flags:
        raise ValueError(f"{flag} is not probed; add it to the {engine} engine's optional_serve_flags")
    info = inspect_engine(cfg, sup, engine)
    flags = info.get("serve_flags")
    if not isinstance(flags, dict) or flag not in flags:
        raise ConfigError(f"engines.{engine}: could not ask the {engine} environment whether its server takes {flag} "
                          f"({info.get('error') or info.get('serve_flags_error') or 'no answer'}); "
                          f"see {cfg.layout.doctor}; `eagle3 doctor CONFIG` shows the probe's result")
    return bool(flags[flag])


def _site_packages_stamp(python) -> str | None:
    """The site-packages dirs of the venv `python` belongs to, with their mtimes; None if not a venv."""
    if python is None:
        return None
    root = Path(python).parent.parent
    if not (root / "pyvenv.cfg").is_file():
        return None
    sites = sorted(root.glob("lib/python*/site-packages"))
    return ";".join(f"{p}:{p.stat().st_mtime_ns}" for p in sites) or None


def _user_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "eagle3"


def _user_cache() -> tuple[Path, dict] | None:
    """(path, entries) of the user's probe cache, or None where it is not provably the user's own."""
    base = _user_cache_dir()
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        owned.check_dir(base, "probe cache directory")
        data = read_json(base / "engine-probes.json", default={})  # proven the user's own, or refused
    except (OSError, ValueError, owned.NotOwned):  # not provably the user's: probe again instead
        return None
    return (base / "engine-probes.json", data) if isinstance(data, dict) else None


WRAPPER_MAX_BYTES = 64 * 1024


def _interpreter_identity(path) -> str | float | None:
    """What says the engine's interpreter changed: a `#!` wrapper script (e.g. bench/gpu_e2e.sh's, which put
    an engine site dir on PYTHONPATH) by its content, so that writing the same wrapper again (every run does
    there) keeps the answers; any other file by its mtime."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(WRAPPER_MAX_BYTES + 1)
        if head.startswith(b"#!") and len(head) <= WRAPPER_MAX_BYTES:
            return "sha256:" + hashlib.sha256(head).hexdigest()
        return Path(path).stat().st_mtime
    except OSError:
        return None


__all__ = ["engine_probe", "import_errors", "inspect_engine", "engine_accepts", "ENGINE_SIDE"]
