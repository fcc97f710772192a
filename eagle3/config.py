"""One pydantic schema for the whole pipeline, validated completely before anything starts.

Relative paths in a config file are resolved against the directory of that file, so a config
means the same thing whatever the caller's working directory is.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from .errors import ConfigError

PHASES: tuple[str, ...] = ("datagen", "extract", "train", "bench")
Port = Annotated[int, Field(ge=1, le=65535)]
PositiveFloat = Annotated[float, Field(gt=0)]

PROTECTED_PROCESS_NAMES = (
    "nvidia-persistenced",
    "nv-fabricmanager",
    "nv-hostengine",
    "dcgm-exporter",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "Xorg",
    "nvidia-device-plugin",
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class EngineEnv(Strict):
    """How to run commands inside an engine's environment: the venv's interpreter (its console
    scripts sit beside it), or a command prefix that enters an environment managed elsewhere
    (e.g. ["conda", "run", "-n", "vllm"]); `python` and console scripts then run under it."""

    python: Path | None = None
    command_prefix: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_way(self) -> "EngineEnv":
        if self.python is None and not self.command_prefix:
            raise ValueError("set either 'python' (path to the engine venv's interpreter) or 'command_prefix'")
        if self.python is not None and self.command_prefix:
            raise ValueError("set only one of 'python' and 'command_prefix'")
        return self

    def python_argv(self) -> list[str]:
        return [*self.command_prefix, "python"] if self.command_prefix else [str(self.python)]

    def script_argv(self, name: str) -> list[str]:
        """argv that runs a console script of the engine env (vllm, speculators, torchrun)."""
        return [*self.command_prefix, name] if self.command_prefix else [str(Path(self.python).parent / name)]


class Engines(Strict):
    vllm: EngineEnv | None = None
    sglang: EngineEnv | None = None
    speculators: EngineEnv | None = None


class Target(Strict):
    model: Path
    served_name: str = Field("target", min_length=1, pattern=r"^[A-Za-z0-9._/-]+$")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int = Field(4096, gt=0)
    tensor_parallel_size: int = Field(1, ge=1)
    trust_remote_code: bool = False


class Server(Strict):
    host: str = "127.0.0.1"
    port: Port
    startup_timeout_s: PositiveFloat = 900.0
    hang_timeout_s: PositiveFloat = 600.0
    stop_grace_s: PositiveFloat = 20.0
    extra_args: list[str] = Field(default_factory=list)
    # The key the server demands and its clients send: given here (api_key; a config file gets copied
    # around), or by the name of an environment variable that holds it (api_key_env). Under Prefect
    # that variable can be filled from a Secret block (api_key_secret_block; resolved in flows/).
    api_key: SecretStr | None = None
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    api_key_secret_block: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]*$")

    @model_validator(mode="after")
    def _one_key_source(self) -> "Server":
        if self.api_key is not None and (self.api_key_env or self.api_key_secret_block):
            raise ValueError("api_key: set the key here or name where it comes from (api_key_env / "
                             "api_key_secret_block), not both")
        if self.api_key_secret_block and not self.api_key_env:
            raise ValueError("api_key_secret_block: also set api_key_env, the environment variable the Prefect "
                             "flow fills from the Secret block (the phases read the key from there)")
        return self

    def key(self, where: str = "server") -> str | None:
        """The API key, or None when the server has none. ConfigError naming the variable when
        api_key_env names one that is not set."""
        if self.api_key is not None:
            return self.api_key.get_secret_value()
        if not self.api_key_env:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            via = (f"; it is filled from the Prefect Secret block {self.api_key_secret_block!r} only when the "
                   "pipeline runs as a Prefect flow (eagle3 run, deployments)" if self.api_key_secret_block else "")
            raise ConfigError(f"{where}.api_key_env: environment variable {self.api_key_env} is not set or empty; "
                              f"export it with the server's API key{via}")
        return value


class Sampling(Strict):
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_tokens: int = Field(2048, gt=0)
    seed: int | None = 0


class Datagen(Strict):
    engine: Literal["vllm", "sglang"] = "vllm"
    prompts: Path
    max_samples: int | None = Field(None, gt=0)
    server: Server
    sampling: Sampling = Sampling()
    concurrency: int = Field(64, ge=1)
    request_timeout_s: PositiveFloat = 600.0
    connect_timeout_s: PositiveFloat = 30.0
    max_retries: int = Field(5, ge=0)
    fsync_every: int = Field(16, ge=1)
    # Extra top-level JSON fields for every chat request (chat_template_kwargs, ignore_eos, ...);
    # they change the generated data, so a resume compares them like the sampling params.
    request_extra: dict[str, Any] = Field(default_factory=dict)
    skip_invalid_prompts: bool = False  # False: any malformed prompt row stops the phase before it starts
    # Prompts the server rejects (e.g. longer than max_model_len) are logged in failures.jsonl; beyond
    # this share of the set without a sample, the phase fails instead of passing a thin data set on.
    max_failed_fraction: float = Field(0.01, ge=0, le=1)

    @field_validator("request_extra")
    @classmethod
    def _no_owned_keys(cls, v):
        owned = sorted(set(v) & {"model", "messages", "stream", "n"})
        if owned:
            raise ValueError(f"{owned} are set by the pack; remove them from request_extra")
        sampling = sorted(set(v) & {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed"})
        if sampling:
            raise ValueError(f"{sampling} belong under datagen.sampling; move them there")
        return v


class Extract(Strict):
    engine: Literal["vllm"] = "vllm"
    server: Server
    aux_layer_ids: list[Annotated[int, Field(ge=0)]] | None = None
    include_last_layer: bool = True
    seq_length: int = Field(8192, gt=0)
    concurrency: int = Field(8, ge=1)
    hidden_states_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_disk_bytes: int | None = Field(None, gt=0)

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, v):
        if v is not None:
            if len(v) < 1:
                raise ValueError("give at least one layer id, or leave it unset for the default (2, L//2, L-3)")
            if len(set(v)) != len(v):
                raise ValueError(f"layer ids must be distinct, got {v}")
        return v


class Train(Strict):
    epochs: int = Field(3, ge=1)
    lr: float = Field(1e-4, gt=0)
    total_seq_len: int = Field(8192, gt=0)
    draft_vocab_size: int | None = Field(None, gt=0)
    num_speculative_tokens: int = Field(3, ge=1, le=16)
    dry_run: Literal["auto", "always", "never"] = "auto"
    extra_args: list[str] = Field(default_factory=list)
    stop_grace_s: PositiveFloat = 150.0
    hang_timeout_s: PositiveFloat = 1800.0


class Bench(Strict):
    engine: Literal["vllm", "sglang"] = "vllm"
    server: Server
    num_speculative_tokens: list[Annotated[int, Field(ge=1, le=16)]] = Field(default_factory=lambda: [3])
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [1, 4, 16])
    num_prompts: int = Field(64, ge=1)
    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(0.0, ge=0)
    warmup_prompts: int = Field(4, ge=0)
    acceptance_floor: float = Field(1.3, ge=1.0)
    # False: requests end at EOS, as in real traffic. True: every request runs to max_tokens, which
    # makes baseline and k runs produce the same token counts even when sampling (temperature > 0).
    ignore_eos: bool = False
    # Benchmark prompts. Default (unset): the rows of datagen.prompts that data generation did not
    # use (held out from training); set it to measure on another prompt set (e.g. MT-Bench as JSONL).
    prompts: Path | None = None
    # Serve this drafter instead of the train phase's output (a published drafter, or a test
    # drafter); `drafter_trained` says whether the acceptance gate applies to it.
    drafter: Path | None = None
    drafter_trained: bool = True
    client_timeout_s: PositiveFloat = 3600.0  # one `vllm bench serve` / bench_serving invocation

    @field_validator("num_speculative_tokens", "concurrency")
    @classmethod
    def _nonempty_sorted(cls, v):
        if not v:
            raise ValueError("give at least one value")
        if len(set(v)) != len(v):
            raise ValueError(f"values must be distinct, got {v}")
        return sorted(v)


class Handoff(Strict):
    grace_s: PositiveFloat = 15.0
    deadline_s: PositiveFloat = 120.0
    poll_interval_s: PositiveFloat = 0.2
    used_mib_threshold: int = Field(16, ge=0)
    protected_process_names: list[str] = Field(default_factory=lambda: list(PROTECTED_PROCESS_NAMES))
    systemd_units: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9@._:-]+$")]] = Field(default_factory=list)
    shm_dir: Path = Path("/dev/shm")
    dev_dir: Path = Path("/dev")
    pycache_dirs: list[Path] = Field(default_factory=list)
    extra_ports: list[Port] = Field(default_factory=list)


class PipelineConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    run_dir: Path
    gpus: list[Annotated[int, Field(strict=True, ge=0)]] = Field(default_factory=list)
    target: Target
    engines: Engines
    datagen: Datagen
    extract: Extract
    train: Train = Train()
    bench: Bench
    handoff: Handoff = Handoff()

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"GPU ids must be distinct, got {v}")
        return v

    # ---- derived -----------------------------------------------------------------------------
    @property
    def cpu_rehearsal(self) -> bool:
        return not self.gpus

    def phase_ports(self, phase: str) -> list[int]:
        server = {"datagen": self.datagen.server, "extract": self.extract.server, "bench": self.bench.server}.get(phase)
        return ([server.port] if server else []) + list(self.handoff.extra_ports)

    def phase_dir(self, phase: str) -> Path:
        return self.run_dir / phase

    def fingerprint(self, section: str | None = None) -> str:
        """Stable hash of the whole config or of one section (secrets excluded)."""
        # Where a key comes from never changes a phase's output; the fields are left out so adding
        # them did not change any existing fingerprint.
        sources = {"api_key_env", "api_key_secret_block"}
        data = self.model_dump(mode="json", exclude={"datagen": {"server": {"api_key", *sources}},
                                                     "extract": {"server": sources}, "bench": {"server": sources}})
        if section is not None:
            data = {"target": data["target"], section: data[section]}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# ---- loading -----------------------------------------------------------------------------------

_PATH_FIELDS = ("run_dir", "target.model", "datagen.prompts", "bench.prompts", "bench.drafter", "engines.*.python",
                "handoff.shm_dir", "handoff.dev_dir", "handoff.pycache_dirs[]")


def _resolve_paths(raw: dict, base: Path) -> dict:
    def fix(value):
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            # normpath, not resolve(): a venv's bin/python is a symlink to the base interpreter, and
            # following it would lose the venv (its site-packages and its console scripts).
            return os.path.normpath(base / value)
        if isinstance(value, str):
            return os.path.expanduser(value)
        return value

    def walk(node, parts):
        if not isinstance(node, dict) or not parts:
            return
        head, rest = parts[0], parts[1:]
        keys = list(node) if head == "*" else [head.rstrip("[]")]
        for key in keys:
            if key not in node:
                continue
            if rest:
                walk(node[key], rest)
            elif head.endswith("[]") and isinstance(node[key], list):
                node[key] = [fix(v) for v in node[key]]
            else:
                node[key] = fix(node[key])

    for spec in _PATH_FIELDS:
        walk(raw, spec.split("."))
    return raw


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "constrained-")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _format_errors(err: ValidationError, source: str) -> list[str]:
    lines = []
    for e in err.errors():
        loc = _loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling (see the config reference in README.md)"
        elif e["type"] == "missing":
            msg = "required field is missing; add it"
        got = e.get("input")
        shown = "" if e["type"] in ("missing", "model_attributes_type") or isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{source}: {loc}: {msg}{shown}")
    return lines


def cross_checks(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """Rules that span sections; each problem is (field path, message with the fix)."""
    problems: list[tuple[str, str]] = []
    seen: dict[int, str] = {}
    for where, port in (("datagen.server.port", cfg.datagen.server.port),
                        ("extract.server.port", cfg.extract.server.port),
                        ("bench.server.port", cfg.bench.server.port)):
        if port in seen:
            problems.append((where, f"port {port} is also used by {seen[port]}; give each server its own port"))
        seen[port] = where
    for phase, engine in (("datagen", cfg.datagen.engine), ("extract", "vllm"), ("bench", cfg.bench.engine)):
        if getattr(cfg.engines, engine) is None:
            problems.append((f"engines.{engine}", f"phase '{phase}' uses engine '{engine}'; set engines.{engine}"))
    if cfg.engines.speculators is None:
        problems.append(("engines.speculators", "extraction and training run the speculators CLI; set engines.speculators"))
    if cfg.gpus and cfg.target.tensor_parallel_size > len(cfg.gpus):
        problems.append(("target.tensor_parallel_size",
                         f"{cfg.target.tensor_parallel_size} exceeds the {len(cfg.gpus)} GPUs listed in 'gpus'"))
    if not cfg.gpus and cfg.target.tensor_parallel_size != 1:
        problems.append(("target.tensor_parallel_size", "a CPU rehearsal (empty 'gpus') supports only 1"))
    return problems


def _semantic_checks(cfg: PipelineConfig, source: str) -> list[str]:
    """Checks that need the filesystem; run after the schema has accepted the shape."""
    problems = [f"{source}: {field}: {msg}" for field, msg in cross_checks(cfg)]
    model = cfg.target.model
    if not model.is_dir():
        problems.append(f"{source}: target.model: directory {str(model)!r} does not exist; "
                        "point it at a Hugging Face model dir (for the CPU rehearsal: `eagle3 make-tiny-model DIR`)")
    elif not (model / "config.json").is_file():
        problems.append(f"{source}: target.model: {str(model)!r} has no config.json; it must be a Hugging Face model dir")
    if not cfg.datagen.prompts.is_file():
        problems.append(f"{source}: datagen.prompts: file {str(cfg.datagen.prompts)!r} does not exist; give a JSONL prompt set")
    if cfg.bench.prompts is not None and not cfg.bench.prompts.is_file():
        problems.append(f"{source}: bench.prompts: file {str(cfg.bench.prompts)!r} does not exist; give a JSONL prompt "
                        "set, or remove the key to benchmark on the prompts data generation held out")
    if cfg.bench.drafter is not None and not (cfg.bench.drafter / "config.json").is_file():
        problems.append(f"{source}: bench.drafter: {str(cfg.bench.drafter)!r} is not a drafter checkpoint dir (no "
                        "config.json); point it at one, or remove the key to serve the train phase's drafter")
    for name in ("vllm", "sglang", "speculators"):
        env = getattr(cfg.engines, name)
        if env is not None and env.python is not None and not os.access(env.python, os.X_OK):
            problems.append(f"{source}: engines.{name}.python: {str(env.python)!r} is not an executable interpreter; "
                            "build it with `make engine-env` or point it at the engine venv's bin/python")
    layers = None
    if model.is_dir() and (model / "config.json").is_file():
        try:
            layers = num_hidden_layers(model)
        except ConfigError as e:  # a corrupt config.json is a finding to list, not a traceback
            problems.append(f"{source}: {e}")
    if cfg.extract.aux_layer_ids and layers is not None:
        bad = [i for i in cfg.extract.aux_layer_ids if i >= layers]
        if layers and bad:
            problems.append(f"{source}: extract.aux_layer_ids: {bad} out of range for a target with {layers} layers "
                            f"(valid: 0..{layers - 1}; the last layer is added by include_last_layer)")
    if cfg.extract.aux_layer_ids is None and layers is not None:
        default = default_aux_layer_ids(layers)
        if layers and (len(set(default)) != len(default) or not all(0 <= i < layers for i in default)):
            # vLLM would silently de-duplicate them and die on a shape mismatch (vllm-cpu.md §4)
            problems.append(f"{source}: extract.aux_layer_ids: unset, and the default (2, L//2, L-3) = {default} is not "
                            f"three distinct layers of this {layers}-layer target; set it explicitly "
                            f"(ids 0..{layers - 1}, e.g. {[max(0, layers - 3), max(0, layers - 2), layers - 1]})")
    return problems


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default aux layers (vLLM convention: the input of decoder layer k)."""
    return [2, num_layers // 2, num_layers - 3]


def num_hidden_layers(model_dir: Path) -> int:
    """The target's layer count from its config.json (0 if absent); ConfigError naming the file if
    the file is not a readable JSON object or the count is not an integer."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"target.model: {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                          "restore the model's config.json") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"target.model: cannot read {path} ({e})") from None
    text = (cfg.get("text_config") or cfg) if isinstance(cfg, dict) else cfg
    if not isinstance(text, dict):
        raise ConfigError(f"target.model: {path} must hold a JSON object (a Hugging Face model config), "
                          f"got {type(text).__name__}")
    value = text.get("num_hidden_layers", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"target.model: {path}: num_hidden_layers is {value!r}, not an integer")
    return value


def parse_config(raw: object, base_dir: Path, source: str = "config", check_files: bool = True) -> PipelineConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {type(raw).__name__}")
    try:
        cfg = PipelineConfig.model_validate(_resolve_paths(dict(raw), base_dir))
    except ValidationError as err:
        raise ConfigError("\n".join(_format_errors(err, source))) from None
    problems = _semantic_checks(cfg, source) if check_files else [
        f"{source}: {field}: {msg}" for field, msg in cross_checks(cfg)]
    if problems:
        raise ConfigError("\n".join(problems))
    return cfg


def load_config(path: Path | str, check_files: bool = True) -> PipelineConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if raw is None:
        raise ConfigError(f"{path}: the file is empty")
    return parse_config(raw, path.resolve().parent, source=str(path), check_files=check_files)


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml"
