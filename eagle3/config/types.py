"""The config's building blocks: the strict base model, the value types, and the sections that are
not a phase's own (target, engines, servers, hidden states, handoff). A phase's section is its
own settings model, named by its row of the phase table (eagle3.phase_table)."""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, WithJsonSchema,
                      create_model, field_validator, model_validator)

from .. import managed
from .. import engine_registry
from ..errors import ConfigError, echo

Port = Annotated[int, Field(ge=1, le=65535)]
# A week: beyond that a budget is a typo, and timers of the standard library overflow near 1e9 s.
PositiveFloat = Annotated[float, Field(gt=0, le=7 * 24 * 3600)]
# Paths are given as strings; every other scalar must have its own type (no "8000" for a port, no
# true for a count): the model config is strict, and only paths opt out of it.
FsPath = Annotated[Path, Field(strict=False)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
# A hostname or an IPv4 address (engine URLs are built as http://host:port, so no IPv6 literal).
Host = Annotated[str, Field(pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?$")]

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
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)


class PhaseSettings(Strict):
    """Base of a phase's config section (the model its phase-table row names as `settings`). What a
    phase knows about its own section lives here, so nothing else names the phase:

    PATH_FIELDS           its path fields, resolved against the config file's directory ("prompts", "a.b")
    FINGERPRINT_EXCLUDE   model_dump exclusions from the phase's fingerprint (keys that do not change its output)
    FINGERPRINT_ALSO      pipeline-wide sections that shape its output (part of its fingerprint once not default)
    FINGERPRINT_UNSET     its fields that count in its fingerprint only once set (added after configs were
                          written without them, which keep their fingerprints)
    checks(cfg)           rules spanning sections: (field under the section, message with the fix)
    file_checks(cfg)      the same, for what needs the filesystem (skipped by check_files=False)
    borrowed_ports(cfg)   ports of other phases' servers this phase runs (a handoff proves them free)
    needs_upstream()      False when this config does not consume the upstream phase's output
    """

    PATH_FIELDS: ClassVar[tuple[str, ...]] = ()
    FINGERPRINT_EXCLUDE: ClassVar[dict[str, Any]] = {}
    FINGERPRINT_ALSO: ClassVar[tuple[str, ...]] = ()
    FINGERPRINT_UNSET: ClassVar[tuple[str, ...]] = ()

    def checks(self, cfg) -> list[tuple[str, str]]:
        return []

    def file_checks(self, cfg) -> list[tuple[str, str]]:
        return []

    def borrowed_ports(self, cfg) -> list[int]:
        return []

    def needs_upstream(self) -> bool:
        return True


class EngineEnv(Strict):
    """How to run commands inside an engine's environment: the venv's interpreter (its console
    scripts sit beside it), or a command prefix that enters an environment managed elsewhere
    (e.g. ["conda", "run", "-n", "vllm"]); `python` and console scripts then run under it."""

    python: FsPath | None = Field(None, description=(
        "The engine venv's interpreter (its console scripts sit beside it); an executable regular file. "
        "Set this or `command_prefix`, not both."))
    command_prefix: list[str] = Field(default_factory=list, description=(
        "A command that enters an environment managed elsewhere, e.g. `[conda, run, -n, vllm]`; `python` and "
        "console scripts then run under it."))
    env: dict[EnvName, str] = Field(default_factory=dict, description=(
        "Environment variables for the engine's processes. Refused: what the pack sets (`CUDA_VISIBLE_DEVICES`, "
        "`CUDA_DEVICE_ORDER` from `gpus`, `VLLM_API_KEY`, `VLLM_PORT`, the pack's process marks) and a "
        "non-loopback `VLLM_HOST_IP` unless a vLLM server has `allow_remote`."))
    compile_cache: bool = Field(True, description=(
        "Keep what this engine's servers compile at start (torch.compile, Inductor and Triton kernels) in the "
        "pack's cache, one directory per model, engine version, flag set and GPU (`$XDG_CACHE_HOME/eagle3/compile`, "
        "else the run dir), so a repeated start reuses it and nothing lands in a shared /tmp. `false` leaves the "
        "engine's own cache variables and defaults alone."))

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


SPECULATORS_ENV = Field(None, description="speculators' environment (extract's data preparation, train).")


@functools.lru_cache(maxsize=8)
def engines_model(names: tuple[str, ...]) -> type[Strict]:
    """The `engines` section: one optional environment per registered engine (eagle3/engine_registry.py),
    then speculators'."""
    fields = {n: (EngineEnv | None, Field(None, description=f"How to run {n} (each phase whose `engine` is {n}).")
                  ) for n in names}
    return create_model("Engines", __base__=Strict, **fields, speculators=(EngineEnv | None, SPECULATORS_ENV))


Engines = engines_model(tuple(engine_registry.BUILTIN))


def _known_engine(name: str) -> str:
    if name not in engine_registry.names():
        raise ValueError(f"unknown engine {echo(name)}; choose one of {', '.join(engine_registry.names())}")
    return name


# A phase's `engine` field: any registered engine (checked when the config is read, so that an engine
# registered by a test or plugin is accepted); the reference lists the built-in ones.
EngineName = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$"), AfterValidator(_known_engine),
                       WithJsonSchema({"type": "string", "enum": list(engine_registry.BUILTIN)})]


class Target(Strict):
    model: FsPath = Field(description="The target model: a Hugging Face model dir whose `config.json` is a "
                                      "regular file.")
    served_name: str = Field("target", min_length=1, pattern=r"^[A-Za-z0-9._/-]+$",
                             description="The model name the servers answer to.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="The target's dtype on "
                                                                                          "every server.")
    max_model_len: int = Field(4096, gt=0, description="Context length of every server.")
    tensor_parallel_size: int = Field(1, ge=1, description=(
        "GPUs one server spans. It must split the target's attention heads evenly (the doctor's "
        "`tensor-parallel` check names the sizes that do: SmolLM2-135M's 9 query / 3 KV heads allow 1 or 3)."))
    data_parallel_size: int = Field(1, ge=1, le=64, description=(
        "Copies of the target one server runs, each on its own `tensor_parallel_size` GPUs (vLLM's "
        "--data-parallel-size, SGLang's --dp-size), its requests spread over them: how a target too small to "
        "split over GPUs, or with heads that do not split, uses them all. `tensor_parallel_size` x this must "
        "fit in `gpus`. How many copies serve changes no phase's output: it is in no fingerprint."))
    trust_remote_code: bool = Field(False, description="Let the engines run the model's own code.")


class Server(Strict):
    # A host other than loopback makes the server reachable from the network: only on request,
    # and every run and the doctor say so. (Declared first: the host check reads it.)
    allow_remote: bool = Field(False, description=(
        "Allow a non-loopback `host`; every run, phase command and the flow then warn, and the doctor reports "
        "`WARN network-exposure`."))
    host: Host = Field("127.0.0.1", description=(
        "Address the server binds: a hostname or IPv4 address. Anything beyond loopback is refused unless "
        "`allow_remote: true`."))
    port: Port = Field(description="The server's port; a handoff proves it free before the phase and after it.")
    startup_timeout_s: PositiveFloat = Field(900.0, description=(
        "Budget from launch to the first 200 of the server's readiness probe; then the whole group is killed "
        "(retryable). Raise it for large models (30-60 min for DeepSeek/Kimi class)."))
    hang_timeout_s: PositiveFloat = Field(600.0, description=(
        "No progress for this long (no log growth, no readiness or output progress, on GPU nodes GPU memory "
        "that does not move) declares the server hung; its group is killed (retryable)."))
    stop_grace_s: PositiveFloat = Field(20.0, description=(
        "SIGTERM to SIGKILL for this server, used by whoever stops it (the phase, the handoff, a recovery)."))
    extra_args: list[str] = Field(default_factory=list, description=(
        "More engine flags. Refused (naming both places): every flag the pack sets itself, in any spelling "
        "(`--flag v`, `--flag=v`, underscores, abbreviations, `-tp`, dotted `--speculative-config.method`, a "
        "`--config` flag file); listed under \"What is refused\"."))
    # The key the server demands and its clients send: given here (api_key; a config file gets copied
    # around), or by the name of an environment variable that holds it (api_key_env). Under Prefect
    # that variable can be filled from a Secret block (api_key_secret_block; resolved in flows/).
    api_key: SecretStr | None = Field(None, description=(
        "The key the server demands and its clients send (printable ASCII, no surrounding spaces: it is an HTTP "
        "header; never echoed). Or name where it comes from with `api_key_env`, not both."))
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description=(
        "The environment variable holding the key; unset or empty when a phase needs it is an error naming it."))
    api_key_secret_block: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9-]*$", description=(
        "A Prefect Secret block the flow loads into `api_key_env` (which must be set too) before the first phase."))

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

    @field_validator("api_key")
    @classmethod
    def _header_safe(cls, v):
        # It travels as "Authorization: Bearer <key>": a control character or non-ASCII text cannot,
        # and HTTP strips surrounding spaces (the server would then compare another key).
        key = v.get_secret_value() if v is not None else None
        if key is not None and (not key or key != key.strip() or not all(" " <= c <= "~" for c in key)):
            raise ValueError("must be non-empty printable ASCII without leading or trailing spaces (it is sent as "
                             "an HTTP header; a newline or other control character cannot be); the key is not shown")
        return v

    @field_validator("host")
    @classmethod
    def _loopback_unless_allowed(cls, v, info: ValidationInfo):
        if not info.data.get("allow_remote") and not managed.is_loopback(v):
            raise ValueError("makes the server reachable from the network; use 127.0.0.1, or set allow_remote: true "
                             "in the same section to allow it (every run then warns)")
        return v



class HiddenStates(Strict):
    """Where training's hidden states come from (docs/pipeline.md, "Hidden-state modes"). offline: phase 2
    writes every sample's file, training reads them. online: phase 2 only prepares the data; the
    train phase runs the extraction server on `server_gpus` and the trainer on `train_gpus` side by
    side, the trainer asking for each sample's hidden states and deleting the file once loaded.
    auto: offline when the estimated files fit the free disk under run_dir with `disk_margin` to
    spare (and within extract.max_disk_bytes), else online."""
    mode: Literal["auto", "offline", "online"] = Field("auto", description=(
        "offline: phase 2 writes every sample's hidden-state file, training reads them. online: phase 2 only "
        "prepares the data; training runs the extraction server beside the trainer, which deletes each file "
        "once loaded. auto: offline when the estimated files fit the free disk under `run_dir` with "
        "`disk_margin` to spare (and within `extract.max_disk_bytes`), else online."))
    disk_margin: float = Field(0.10, ge=0, lt=1, description="Share of the free disk `auto` keeps spare.")
    server_gpus: list[Annotated[int, Field(strict=True, ge=0)]] = Field(default_factory=list, description=(
        "online: the extraction server's GPUs; inside `gpus`, at least `target.tensor_parallel_size`; disjoint from "
        "`train_gpus`, or shared with them when `extract.server.extra_args` caps `--gpu-memory-utilization` at 0.5 "
        "or less (so one GPU can hold both)."))
    train_gpus: list[Annotated[int, Field(strict=True, ge=0)]] = Field(default_factory=list, description=(
        "online: the trainer's GPUs; inside `gpus`; disjoint from `server_gpus` unless shared as described there."))
    # Unset: 4 × (samples in flight) × the largest sample's bytes (eagle3/phases/hs_mode.py).
    cache_max_bytes: int | None = Field(None, gt=0, description=(
        "online: most bytes of files the server wrote and the trainer has not yet loaded and deleted "
        "(default: 4 × samples in flight × the largest sample's bytes)."))



class Handoff(Strict):
    grace_s: PositiveFloat = Field(15.0, description=(
        "SIGTERM to SIGKILL for a process the handoff ends that has no grace of its own."))
    deadline_s: PositiveFloat = Field(120.0, description=(
        "Longest wait for the GPUs and ports to be proven free, counted from when the handoff has stopped what it "
        "stops (each service within its own `stop_grace_s`); must exceed `grace_s` and `poll_interval_s`."))
    poll_interval_s: PositiveFloat = Field(0.2, description="How often the handoff re-checks what it waits for.")
    used_mib_threshold: int = Field(16, ge=0, description="GPU memory (MiB) above which a GPU counts as in use.")
    protected_process_names: list[str] = Field(default_factory=lambda: list(PROTECTED_PROCESS_NAMES), description=(
        "Node daemons that may hold a GPU and are never signalled (default: the NVIDIA persistence, fabric "
        "manager, DCGM, MPS, device plugin daemons and Xorg)."))
    systemd_units: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9@._:-]+$")]] = Field(
        default_factory=list, description=(
        "systemd units the pipeline owns (e.g. a model server an operator runs as a unit), stopped in a handoff."))
    shm_dir: FsPath = Field(Path("/dev/shm"), description="Where unused shared-memory files of the pipeline's "
                                                          "user are purged.")
    dev_dir: FsPath = Field(Path("/dev"), description="Where the GPU device files are (holders are found by "
                                                      "their open files).")
    pycache_dirs: list[FsPath] = Field(default_factory=list, description=(
        "`__pycache__` dirs, or package dirs whose `__pycache__` dirs are purged of *.pyc in a handoff (a "
        "patch that keeps mtime and size leaves CPython loading the old bytecode)."))
    extra_ports: list[Port] = Field(default_factory=list, description="More ports every handoff proves free.")



def non_finite(value: object) -> bool:
    """Whether a JSON-like value holds inf or nan anywhere (JSON cannot carry them)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        stack.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
    return False
