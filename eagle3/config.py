"""One pydantic schema for the whole pipeline, validated completely before anything starts.

Relative paths in a config file are resolved against the directory of that file, so a config
means the same thing whatever the caller's working directory is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from . import managed, owned, phase_table, safe_yaml
from .errors import ConfigError, echo
from .layout import RunLayout
from .inputfiles import MAX_JSON_BYTES, decode_utf8, dir_problem, file_problem, read_capped

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
    vllm: EngineEnv | None = Field(None, description="vLLM's environment (datagen, extract, bench).")
    sglang: EngineEnv | None = Field(None, description="SGLang's environment (datagen, bench).")
    speculators: EngineEnv | None = Field(None, description="speculators' environment (extract's data "
                                                            "preparation, train).")


class Target(Strict):
    model: FsPath = Field(description="The target model: a Hugging Face model dir whose `config.json` is a "
                                      "regular file.")
    served_name: str = Field("target", min_length=1, pattern=r"^[A-Za-z0-9._/-]+$",
                             description="The model name the servers answer to.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description="The target's dtype on "
                                                                                          "every server.")
    max_model_len: int = Field(4096, gt=0, description="Context length of every server.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one server spans.")
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


class Sampling(Strict):
    temperature: float = Field(0.6, ge=0, description="Sampling temperature of the generated answers.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of the generated answers.")
    max_tokens: int = Field(2048, gt=0, description="Longest answer (vLLM clamps it to `max_model_len`).")
    seed: int | None = Field(0, description="Base seed; each prompt's seed is derived from it and the prompt id, "
                                            "so a resumed run generates the same text.")


class Datagen(Strict):
    engine: Literal["vllm", "sglang"] = Field("vllm", description="The engine that serves the target.")
    prompts: FsPath = Field(description=(
        "The prompt set, a JSONL regular file: `id` plus `conversations`/`messages` (role/content, or ShareGPT "
        "from/value) or `prompt`."))
    max_samples: int | None = Field(None, gt=0, description=(
        "Use the first N prompts (default: all); the rest are held out for the benchmark."))
    server: Server = Field(description="The data-generation server (`*.server` below).")
    sampling: Sampling = Field(Sampling(), description="Sampling of the generated answers (`datagen.sampling`).")
    concurrency: int = Field(64, ge=1, description="Requests in flight.")
    request_timeout_s: PositiveFloat = Field(600.0, description="Longest wait for one read of a response.")
    connect_timeout_s: PositiveFloat = Field(30.0, description="Longest wait to connect to the server.")
    max_retries: int = Field(5, ge=0, description="Retries of a transient request error, per prompt.")
    fsync_every: int = Field(16, ge=1, description="Samples written between two fsyncs of samples.jsonl.")
    # They change the generated data, so a resume compares them like the sampling params.
    request_extra: dict[str, Any] = Field(default_factory=dict, description=(
        "Extra top-level JSON fields of every chat request (e.g. `chat_template_kwargs`); a resume must match "
        "them. Refused: `model`, `messages`, `stream`, `n` (set by the pack) and sampling parameters (they "
        "belong under `datagen.sampling`)."))
    skip_invalid_prompts: bool = Field(False, description=(
        "Skip malformed prompt rows (logged) instead of stopping the phase before it starts."))
    # Beyond this share of the set without a sample, the phase fails instead of passing a thin data set on.
    max_failed_fraction: float = Field(0.01, ge=0, le=1, description=(
        "Share of the prompts that may end without a sample (the server rejected them, e.g. longer than "
        "`max_model_len`; reasons in failures.jsonl); beyond it the phase fails and a rerun retries only those."))

    @field_validator("request_extra")
    @classmethod
    def _no_owned_keys(cls, v):
        if _non_finite(v):
            raise ValueError("holds inf or nan, which JSON cannot carry; use a finite number")
        owned = sorted(set(v) & {"model", "messages", "stream", "n"})
        if owned:
            raise ValueError(f"{owned} are set by the pack; remove them from request_extra")
        sampling = sorted(set(v) & {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed"})
        if sampling:
            raise ValueError(f"{sampling} belong under datagen.sampling; move them there")
        return v


class Extract(Strict):
    engine: Literal["vllm"] = Field("vllm", description="The engine that extracts hidden states.")
    server: Server = Field(description="The extraction server (`*.server` below).")
    aux_layer_ids: list[Annotated[int, Field(ge=0)]] | None = Field(None, description=(
        "Target layers whose hidden states the drafter learns from, vllm convention (input of decoder layer k); "
        "distinct. Default: 2, L//2, L-3 of an L-layer target."))
    include_last_layer: bool = Field(True, description="Also extract the last layer (the verifier's hidden "
                                                       "states speculators trains against).")
    seq_length: int = Field(8192, gt=0, description="Longest sample, in tokens.")
    concurrency: int = Field(8, ge=1, description="Requests in flight.")
    hidden_states_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field("auto", description=(
        "dtype of the stored hidden states; `auto` accepts what the engine chose."))
    max_disk_bytes: int | None = Field(None, gt=0, description=(
        "Refuse before starting when the estimated hidden states would exceed this many bytes."))

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, v):
        if v is not None:
            if len(v) < 1:
                raise ValueError("give at least one layer id, or leave it unset for the default (2, L//2, L-3)")
            if len(set(v)) != len(v):
                raise ValueError(f"layer ids must be distinct, got {echo(v)}")
        return v


class Train(Strict):
    epochs: int = Field(3, ge=1, description="Training epochs.")
    lr: float = Field(1e-4, gt=0, description="Learning rate.")
    total_seq_len: int = Field(8192, gt=0, description="Tokens per packed training sequence.")
    draft_vocab_size: int | None = Field(None, gt=0, description="The drafter's vocabulary (default: the "
                                                                 "trainer's).")
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Tokens the drafter proposes per step.")
    dry_run: Literal["auto", "always", "never"] = Field("auto", description=(
        "`auto`: a CPU rehearsal (no `gpus`) writes an UNTRAINED dry-run checkpoint instead of training."))
    # `auto` is what the installed speculators and torch are known to train with (eagle3/engines/trainer_compat.py).
    loss_implementation: Literal["auto", "fused", "eager"] = Field("auto", description=(
        "speculators' loss kernel. `auto`: its default (`fused`), except where that is known to fail with the "
        "installed speculators and torch (then `eager`; the doctor names the combination)."))
    draft_attn_impl: Literal["auto", "simple_flex_attention", "sdpa", "eager"] = Field("auto", description=(
        "The drafter's attention during training. `auto`: speculators' default, except with a known-bad "
        "speculators/torch combination (then `sdpa`)."))
    extra_args: list[str] = Field(default_factory=list, description=(
        "More trainer flags; the flags the train phase passes (`--save-path`, `--epochs`, `--lr`, "
        "`--target-layer-ids`, ...) are refused, in any spelling."))
    stop_grace_s: PositiveFloat = Field(150.0, description=(
        "SIGTERM to SIGKILL for the trainer, whoever stops it: the time it has to save `interrupted/`."))
    hang_timeout_s: PositiveFloat = Field(1800.0, description="No training progress for this long declares the "
                                                              "trainer hung.")


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
    # Unset: 4 × (samples in flight) × the largest sample's bytes (eagle3/hs_mode.py).
    cache_max_bytes: int | None = Field(None, gt=0, description=(
        "online: most bytes of files the server wrote and the trainer has not yet loaded and deleted "
        "(default: 4 × samples in flight × the largest sample's bytes)."))


class BenchWatch(Strict):
    """Comparison of each benchmark result with the run dir's bench-history (eagle3/benchwatch.py)."""

    enabled: bool = Field(True, description="Compare each result with the run dir's bench history.")
    fail_on_regression: bool = Field(True, description="A regression fails the phase (exit 1); false: only "
                                                       "reported.")
    # A figure beyond the noise is a regression only if it is also worse by more than this (percent).
    acceptance_tolerance_pct: float = Field(3.0, ge=0, description=(
        "An acceptance figure outside the history's noise is a regression only when also worse by more than "
        "this many percent."))
    speed_tolerance_pct: float = Field(10.0, ge=0, description=(
        "The same for the speed figures (throughput, speedup)."))


class BenchParity(Strict):
    """Serve-parity gate: the drafter served on a sample of its training prompts must come close to
    what training measured on them (eagle3/benchgates.py)."""

    enabled: bool = Field(True, description="Serve the drafter on a sample of its training prompts and compare "
                                            "with what training measured on them.")
    prompts: int = Field(16, ge=1, description="Training prompts in the sample, spread evenly over the rows data "
                                               "generation used.")
    # A broken handover gives ~0; the sound fixture drafter, greedy on CPU, 0.35-0.41 (eagle3/benchgates.py).
    min_fraction: float = Field(0.3, gt=0, le=1, description=(
        "Measured (acceptance length - 1) must reach this share of training's expectation."))
    expected_full_acc: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(None, description=(
        "Training's per-position validation accuracy (speculators' val/full_acc_i_epoch). Default: the train "
        "manifest's `val_full_acc` (recorded by a GPU run); set it for a `bench.drafter`."))


class Bench(Strict):
    engine: Literal["vllm", "sglang"] = Field("vllm", description="The engine benchmarked.")
    server: Server = Field(description="The benchmark's servers, one per k (`*.server` below).")
    num_speculative_tokens: list[Annotated[int, Field(ge=1, le=16)]] = Field(
        default_factory=lambda: [3], description="Each k measured against the baseline; distinct, sorted.")
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1, 4, 16], description="Each concurrency measured (one window each); distinct, "
                                                        "sorted.")
    num_prompts: int = Field(64, ge=1, description="Benchmark prompts per window.")
    max_tokens: int = Field(256, ge=1, description="Longest answer per request.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of the benchmark requests.")
    warmup_prompts: int = Field(4, ge=0, description="Unmeasured requests sent to each server "
                                                                  "before its first window.")
    acceptance_floor: float = Field(1.3, ge=1.0, description=(
        "A trained drafter whose best acceptance length is below this fails the phase (exit 1)."))
    ignore_eos: bool = Field(False, description=(
        "false: requests end at EOS, as in real traffic. true: every request runs to `max_tokens`, so baseline "
        "and k runs produce the same token counts even when sampling."))
    prompts: FsPath | None = Field(None, description=(
        "Benchmark prompts: a prompt set file (JSONL, JSON, parquet) or a saved dataset directory (docs/benchmark.md, "
        "\"Prompt sets\"). Default: the rows of `datagen.prompts` data generation held out."))
    drafter: FsPath | None = Field(None, description=(
        "Serve this drafter dir instead of the train phase's output (default: the train phase's manifest)."))
    drafter_trained: bool = Field(True, description="Whether the acceptance gate applies to `bench.drafter`.")
    client_timeout_s: PositiveFloat = Field(3600.0, description="Budget of one load-generator window.")
    # F4 of docs/FACTS.md §8: ~15 % per token.
    first_position_floor: float = Field(0.3, ge=0, le=1, description=(
        "Gate for a trained drafter on GPUs: the first draft position's acceptance must reach this share."))
    watch: BenchWatch = Field(BenchWatch(), description="Comparison with the run dir's bench history "
                                                        "(`bench.watch` below).")
    parity: BenchParity = Field(BenchParity(), description="The serve-parity gate (`bench.parity` below).")

    @field_validator("num_speculative_tokens", "concurrency")
    @classmethod
    def _nonempty_sorted(cls, v):
        if not v:
            raise ValueError("give at least one value")
        if len(set(v)) != len(v):
            raise ValueError(f"values must be distinct, got {echo(v)}")
        return sorted(v)


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


class PipelineConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description=(
        "The pipeline's name (Prefect run names, artifact keys, the bench history)."))
    run_dir: FsPath = Field(description=(
        "Where every phase's output and the run's state go; created if missing. Refused: system directories "
        "and anything inside them, `$HOME` or above it, the pack's checkout (or above it, or its sources), a "
        "file or a path below one, a directory not writable."))
    gpus: list[Annotated[int, Field(strict=True, ge=0)]] = Field(default_factory=list, description=(
        "GPU indices in PCI order, distinct; empty: a CPU rehearsal."))
    target: Target = Field(description="The target model (`target` below).")
    engines: Engines = Field(description="How to run each engine (`engines.*` below); each engine a phase uses "
                                         "must be given.")
    datagen: Datagen = Field(description="Phase 1, data generation (`datagen` below).")
    extract: Extract = Field(description="Phase 2, hidden-state extraction (`extract` below).")
    train: Train = Field(Train(), description="Phase 3, drafter training (`train` below).")
    bench: Bench = Field(description="Phase 4, the benchmark (`bench` below).")
    handoff: Handoff = Field(Handoff(), description="The GPU handoff between phases (`handoff` below).")
    hidden_states: HiddenStates = Field(HiddenStates(), description=(
        "Where training's hidden states come from (`hidden_states` below; docs/pipeline.md, \"Hidden-state modes\")."))

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"GPU ids must be distinct, got {echo(v)}")
        return v

    # ---- derived -----------------------------------------------------------------------------
    @property
    def cpu_rehearsal(self) -> bool:
        return not self.gpus

    def phase_ports(self, phase: str) -> list[int]:
        return phase_table.ports(self, phase)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    def phase_dir(self, phase: str) -> Path:
        return self.layout.phase_dir(phase)

    def fingerprint(self, section: str | None = None) -> str:
        """Stable hash of the whole config or of one section (secrets excluded). Left out too, so that
        adding them changed no existing fingerprint: where a key comes from, and allow_remote; neither
        changes a phase's output; and the benchmark's checks, which re-judge its measurements."""
        server = {"allow_remote", "api_key_env", "api_key_secret_block"}
        # The benchmark's checks (watch, parity, first-position floor) came later; left out likewise.
        bench = {"server": server, "watch": True, "parity": True, "first_position_floor": True}
        data = self.model_dump(mode="json", exclude={"datagen": {"server": {"api_key", *server}},
                                                     "extract": {"server": server}, "bench": bench})
        hs = data.pop("hidden_states")
        if section is not None:
            data = {"target": data["target"], section: data.get(section)}  # a phase may have no section
        # Left out while at its defaults, so that configs written before it keep their fingerprints;
        # set, it is part of the phases whose output it shapes.
        if hs != HiddenStates().model_dump(mode="json") and section in (None, "extract", "train"):
            data["hidden_states"] = hs
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


MAX_CONFIG_BYTES = 1 << 20  # a config is a few KB; the cap also bounds the parsing time (< 1 s)
MAX_STRING_CHARS = 1 << 16  # a command-line argument holds at most 128 KiB (Linux MAX_ARG_STRLEN)
MAX_LISTED = 40             # problems listed in one message; the rest are counted
MAX_LINE_CHARS = 2000
_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a mapping",
          type(None): "null"}
_PATTERN_HINTS = {
    "host": "must be a hostname or an IPv4 address such as 127.0.0.1 (no scheme, port or IPv6 literal)",
    "[key]": "an environment variable name must be letters, digits and underscores, not starting with a digit",
}


def _kind(value: object) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "constrained-")):
            continue
        else:
            out += ("." if out else "") + echo(str(part), 60, quote=False)
    return out or "(top level)"


def _format_errors(err: ValidationError, source: str) -> list[str]:
    lines = []
    for e in err.errors(include_url=False):
        loc = _loc(e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling (see the config reference in docs/config.md)"
        elif e["type"] == "missing":
            msg = "required field is missing; add it"
        elif e["type"] == "string_pattern_mismatch":
            msg = next((hint for end, hint in _PATTERN_HINTS.items() if loc.endswith(end)), msg)
        lines.append(f"{source}: {loc}: {msg}{_shown(e, loc)}")
    return lines


def _shown(e: dict, loc: str) -> str:
    """What was given, as far as a message may echo it: never a secret, never more than a line."""
    got = e.get("input")
    if e["type"] in ("missing", "model_attributes_type") or isinstance(got, dict) or "api_key" in loc:
        return ""
    booleans = isinstance(got, bool) and e["type"] != "bool_type"
    hint = "; YAML reads true/false/yes/no/on/off as booleans" if booleans else ""
    return f" (got {echo(got)}, {_kind(got)}{hint})"


def _raw_problems(raw: dict) -> list[str]:
    """Text no destination can carry, whatever field it is in: a NUL (argv, environment and paths
    end at it) and strings beyond what one command-line argument may hold."""
    problems, stack = [], [(raw, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                problems.append(f"{where or '(top level)'}: contains a NUL character, which no command line, "
                                "environment variable or path can carry; remove it")
            if len(value) > MAX_STRING_CHARS:
                problems.append(f"{where or '(top level)'}: a string of {len(value)} characters, more than the "
                                f"{MAX_STRING_CHARS} allowed (an engine argument can hold at most 128 KiB)")
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                inner = (where + "." if where else "") + echo(str(key), 60, quote=False)
                stack.append((item, inner))
                if isinstance(key, str):
                    stack.append((key, f"{inner} (the key)"))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]") for i, item in reversed(list(enumerate(value))))
    return problems


def _non_finite(value: object) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            return True
        stack.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
    return False


def server_engines(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """(phase section, engine) of each phase that runs a server."""
    return [(phase, engine) for phase, _, engine in phase_table.servers(cfg)]


def cross_checks(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """Rules that span sections; each problem is (field path, message with the fix)."""
    problems: list[tuple[str, str]] = []
    seen: dict[int, str] = {}
    for where, port in ((f"{phase}.server.port", server.port) for phase, server, _ in phase_table.servers(cfg)):
        if port in seen:
            problems.append((where, f"port {port} is also used by {seen[port]}; give each server its own port"))
        seen[port] = where
    for phase, engine in server_engines(cfg):
        if getattr(cfg.engines, engine) is None:
            problems.append((f"engines.{engine}", f"phase '{phase}' uses engine '{engine}'; set engines.{engine}"))
    if cfg.engines.speculators is None:
        problems.append(("engines.speculators", "extraction and training run the speculators CLI; set engines.speculators"))
    if cfg.gpus and cfg.target.tensor_parallel_size > len(cfg.gpus):
        problems.append(("target.tensor_parallel_size",
                         f"{cfg.target.tensor_parallel_size} exceeds the {len(cfg.gpus)} GPUs listed in 'gpus'"))
    if not cfg.gpus and cfg.target.tensor_parallel_size != 1:
        problems.append(("target.tensor_parallel_size", "a CPU rehearsal (empty 'gpus') supports only 1"))
    return problems + _managed_conflicts(cfg) + _bounds(cfg) + _online_gpu_sets(cfg)


SHARED_GPU_FRACTION = 0.5  # the most of a GPU's memory an extraction server may take beside the trainer


def _no_room_to_share(cfg: PipelineConfig) -> str | None:
    """Why the extraction server leaves the trainer no room on a GPU they share, or None. vLLM takes
    `--gpu-memory-utilization` of each GPU's memory (0.9 unless set) at startup, before the trainer starts."""
    raw = managed.flag_value(list(cfg.extract.server.extra_args), "--gpu-memory-utilization")
    if raw is None:
        return "the server takes vLLM's default 90 % of each GPU's memory"
    try:
        fraction = float(raw)
    except ValueError:
        return f"--gpu-memory-utilization {echo(raw)} is not a number"
    if not 0 < fraction <= SHARED_GPU_FRACTION:
        return f"--gpu-memory-utilization {fraction:g} leaves the trainer less than half of the GPU"
    return None


def _online_gpu_sets(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """The online step's two GPU sets: disjoint, inside `gpus`, the server's large enough for the
    target's tensor parallelism. Empty both on a CPU rehearsal (both processes run on the CPU)."""
    hs, problems = cfg.hidden_states, []
    sets = (("hidden_states.server_gpus", hs.server_gpus), ("hidden_states.train_gpus", hs.train_gpus))
    for where, ids in sets:
        if len(set(ids)) != len(ids):
            problems.append((where, f"GPU ids must be distinct, got {echo(ids)}"))
        outside = sorted(set(ids) - set(cfg.gpus))
        if outside:
            problems.append((where, f"GPUs {outside} are not in 'gpus' {cfg.gpus}: the handoff proves only 'gpus' free; "
                                    "list them there or remove them here"))
    shared = sorted(set(hs.server_gpus) & set(hs.train_gpus))
    if shared and (why := _no_room_to_share(cfg)):
        problems.append(("hidden_states.train_gpus", f"GPUs {shared} are also in hidden_states.server_gpus: the server "
                         f"and the trainer run at the same time, and {why}. Fix: give them disjoint GPUs, or cap the "
                         f"server's share of each GPU: add [--gpu-memory-utilization, '{SHARED_GPU_FRACTION}'] (at most "
                         f"{SHARED_GPU_FRACTION}) to extract.server.extra_args"))
    if hs.server_gpus and cfg.target.tensor_parallel_size > len(hs.server_gpus):
        problems.append(("hidden_states.server_gpus", f"{len(hs.server_gpus)} GPU(s) for a target with "
                                                      f"tensor_parallel_size {cfg.target.tensor_parallel_size}"))
    if hs.mode == "online" and cfg.gpus and not (hs.server_gpus and hs.train_gpus):
        problems.append(("hidden_states.mode", "online needs two GPU sets: set hidden_states.server_gpus and "
                                               "hidden_states.train_gpus (disjoint subsets of 'gpus')"))
    return problems


def _managed_conflicts(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """What extra_args or an engine env would set a second time (eagle3/managed.py says why not)."""
    twice = "a second value silently wins or loses"
    problems = []
    for section, engine in server_engines(cfg):
        args = list(getattr(cfg, section).server.extra_args)
        for i, arg, owner in managed.flag_conflicts(args, managed.server_flag_table(engine, section), section):
            problems.append((f"{section}.server.extra_args[{i}]", f"{echo(arg)} is also set by the pack, from {owner}; "
                                                                 f"{twice}: remove it from extra_args"))
    for i, arg, owner in managed.flag_conflicts(list(cfg.train.extra_args), managed.TRAIN_FLAGS):
        problems.append((f"train.extra_args[{i}]", f"{echo(arg)} is also set by the pack, from {owner}; {twice}: "
                                                   "remove it from extra_args"))
    for name in ("vllm", "sglang", "speculators"):
        env = getattr(cfg.engines, name)
        if env is not None:
            remote_ok = any(getattr(cfg, s).server.allow_remote for s, e in server_engines(cfg) if e == name)
            problems += [(f"engines.{name}.env.{var}", why) for var, why in managed.env_conflicts(name, env.env, remote_ok)]
    return problems


def _bounds(cfg: PipelineConfig) -> list[tuple[str, str]]:
    """Values that bound one another. (Not here, as they are not contradictions: a hang timeout
    above the startup budget, a connect timeout above the per-read request timeout, max_tokens
    beyond max_model_len, which vLLM clamps.)"""
    problems = []
    h = cfg.handoff
    if h.deadline_s <= h.grace_s:
        problems.append(("handoff.deadline_s", f"{h.deadline_s:g} s is not more than handoff.grace_s ({h.grace_s:g} s): "
                         "ending the services may use the whole grace and leave no time to see the GPUs freed; "
                         "make deadline_s larger than grace_s"))
    if h.poll_interval_s >= h.deadline_s:
        problems.append(("handoff.poll_interval_s", f"{h.poll_interval_s:g} s is not less than handoff.deadline_s "
                         f"({h.deadline_s:g} s): the GPUs would be looked at once; make it smaller"))
    return problems


def remote_binds(cfg: PipelineConfig) -> list[str]:
    """One line per network exposure the config allows (allow_remote), for every run and the doctor to say."""
    lines = []
    for section, _ in server_engines(cfg):
        server = getattr(cfg, section).server
        if not managed.is_loopback(server.host):
            lines.append(f"{section}.server.host is {server.host}: the {section} server is reachable from the network "
                         f"(allowed by {section}.server.allow_remote){'' if server.api_key else ', without an api_key'}")
    for name, var in managed.REMOTE_ENV.items():
        env = getattr(cfg.engines, name)
        if env is not None and var in env.env and not managed.is_loopback(env.env[var]):
            lines.append(f"engines.{name}.env.{var} is {echo(env.env[var])}: {name}'s internal ports are reachable "
                         "from the network (allowed by allow_remote)")
    return lines


# ---- where the pipeline writes -----------------------------------------------------------------

CHECKOUT = Path(__file__).resolve().parent.parent
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


def _semantic_checks(cfg: PipelineConfig, source: str) -> list[str]:
    """Checks that need the filesystem; run after the schema has accepted the shape."""
    problems = []
    model = cfg.target.model
    config_json = model / "config.json"
    if why := dir_problem(model):
        problems.append(f"{source}: target.model: {str(model)!r} {why}; point it at a Hugging Face model dir "
                        "(for the CPU rehearsal: `eagle3 make-tiny-model DIR`)")
    elif why := file_problem(config_json):
        problems.append(f"{source}: target.model: {str(model)!r} has no usable config.json ({config_json} {why}); "
                        "it must be a Hugging Face model dir")
    if why := file_problem(cfg.datagen.prompts):
        problems.append(f"{source}: datagen.prompts: {str(cfg.datagen.prompts)!r} {why}; give a JSONL prompt set file")
    # A saved dataset directory is a prompt set too (eagle3/promptsets.py).
    if cfg.bench.prompts is not None and (why := file_problem(cfg.bench.prompts)) and dir_problem(cfg.bench.prompts):
        problems.append(f"{source}: bench.prompts: {str(cfg.bench.prompts)!r} {why}; give a prompt set file (JSONL, "
                        "JSON, parquet) or a saved dataset directory, or remove the key to benchmark on the prompts "
                        "data generation held out")
    drafter = cfg.bench.drafter
    if drafter is not None and (
            why := dir_problem(drafter) or _prefixed("its config.json", file_problem(drafter / "config.json"))):
        problems.append(f"{source}: bench.drafter: {str(drafter)!r} is not a drafter checkpoint dir ({why}); point "
                        "it at one, or remove the key to serve the train phase's drafter")
    for name in ("vllm", "sglang", "speculators"):
        env = getattr(cfg.engines, name)
        if env is not None and env.python is not None and (
                why := file_problem(env.python) or (None if os.access(env.python, os.X_OK) else "is not executable")):
            problems.append(f"{source}: engines.{name}.python: {str(env.python)!r} {why}; it must be an executable "
                            "interpreter: build it with `make engine-env` or point it at the engine venv's bin/python")
    for where, path in (("handoff.shm_dir", cfg.handoff.shm_dir), ("handoff.dev_dir", cfg.handoff.dev_dir),
                        *((f"handoff.pycache_dirs[{i}]", p) for i, p in enumerate(cfg.handoff.pycache_dirs))):
        if os.path.lexists(path) and (why := dir_problem(path)):
            problems.append(f"{source}: {where}: {str(path)!r} {why}; it must be a directory")
    layers = None
    if not dir_problem(model) and not file_problem(config_json):
        try:
            layers = num_hidden_layers(model)
        except ConfigError as e:  # a corrupt config.json is a finding to list, not a traceback
            problems.append(f"{source}: {e}")
    if cfg.extract.aux_layer_ids and layers is not None:
        bad = [i for i in cfg.extract.aux_layer_ids if i >= layers]
        if layers and bad:
            problems.append(f"{source}: extract.aux_layer_ids: {echo(bad)} out of range for a target with {layers} "
                            f"layers (valid: 0..{layers - 1}; the last layer is added by include_last_layer)")
    if cfg.extract.aux_layer_ids is None and layers is not None:
        default = default_aux_layer_ids(layers)
        if layers and (len(set(default)) != len(default) or not all(0 <= i < layers for i in default)):
            # vLLM would silently de-duplicate them and die on a shape mismatch (docs/FACTS.md §4)
            problems.append(f"{source}: extract.aux_layer_ids: unset, and the default (2, L//2, L-3) = {default} is not "
                            f"three distinct layers of this {layers}-layer target; set it explicitly "
                            f"(ids 0..{layers - 1}, e.g. {[max(0, layers - 3), max(0, layers - 2), layers - 1]})")
    return problems


def _prefixed(prefix: str, why: str | None) -> str | None:
    return f"{prefix} {why}" if why else None


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's default aux layers (vLLM convention: the input of decoder layer k)."""
    return [2, num_layers // 2, num_layers - 3]


def num_hidden_layers(model_dir: Path) -> int:
    """The target's layer count from its config.json (0 if absent); ConfigError naming the file if
    the file is not a readable JSON object or the count is not an integer."""
    path = Path(model_dir) / "config.json"
    data = read_capped(path, MAX_JSON_BYTES, "target.model")
    try:
        cfg = json.loads(data)
    except json.JSONDecodeError as e:
        raise ConfigError(f"target.model: {path} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                          "restore the model's config.json") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"target.model: {path} is not UTF-8 JSON (byte offset {e.start}); restore it") from None
    except RecursionError:
        raise ConfigError(f"target.model: {path} is nested too deeply to be a model config; restore it") from None
    text = (cfg.get("text_config") or cfg) if isinstance(cfg, dict) else cfg
    if not isinstance(text, dict):
        raise ConfigError(f"target.model: {path} must hold a JSON object (a Hugging Face model config), "
                          f"got {type(text).__name__}")
    value = text.get("num_hidden_layers", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"target.model: {path}: num_hidden_layers is {echo(value)}, not an integer")
    return value


def _listing(lines: list[str]) -> str:
    shown = [line if len(line) <= MAX_LINE_CHARS else line[: MAX_LINE_CHARS - 3] + "..." for line in lines[:MAX_LISTED]]
    more = [f"... and {len(lines) - MAX_LISTED} more problems"] if len(lines) > MAX_LISTED else []
    return "\n".join(shown + more)


def parse_config(raw: object, base_dir: Path, source: str = "config", check_files: bool = True) -> PipelineConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of sections (name:, run_dir:, target:, ...), "
                          f"got {_kind(raw)}")
    problems = [f"{source}: {p}" for p in _raw_problems(raw)]
    try:
        cfg = PipelineConfig.model_validate(_resolve_paths(dict(raw), base_dir))
    except ValidationError as err:
        raise ConfigError(_listing(problems + _format_errors(err, source))) from None
    problems += [f"{source}: {field}: {msg}" for field, msg in cross_checks(cfg)]
    if why := owned_dir_problem(cfg.run_dir, writable=check_files):
        problems.append(f"{source}: run_dir: {why}")
    elif why := owned.ancestor_problem(cfg.run_dir) or owned.owner_problem(cfg.run_dir):
        problems.append(f"{source}: run_dir: {cfg.run_dir}: {why}")
    if check_files:
        problems += _semantic_checks(cfg, source)
    if problems:
        raise ConfigError(_listing(problems))
    return cfg


def load_config(path: Path | str, check_files: bool = True) -> PipelineConfig:
    """Read, parse and validate a config file completely; ConfigError listing every problem. Bounded
    in time and memory whatever the file holds (see safe_yaml and inputfiles)."""
    path = Path(path)
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: config file not found")
    text = decode_utf8(read_capped(path, MAX_CONFIG_BYTES, "config file"), str(path))
    raw = safe_yaml.load(text, str(path))
    if raw is None:
        raise ConfigError(f"{path}: the file is empty (or holds only comments); start from configs/tiny-cpu.yaml")
    return parse_config(raw, path.resolve().parent, source=str(path), check_files=check_files)


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny-cpu.yaml"
