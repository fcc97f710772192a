"""What the pack knows about one serving engine, in one object.

An engine is one module that defines a subclass of `Engine` and an instance of it named ENGINE, plus
one entry in eagle3/engine_registry.py. Everything the pack does with an engine goes through that
object: the server's command line and readiness, how it is told to speculate and how it counts what
it accepted, its load generator, the drafter layout it loads, the flags and variables the pack sets
on it (so a config may not set them twice), and how its version and capabilities are probed.

Nothing here imports the config: the engine modules are read by the config's own checks."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from ..process.readiness import Probe
    from .loadgen import LoadResult, LoadSpec
    from .metrics import SpecCounters, Traffic

# What a managed speculative-decoding flag is set from, for every engine's managed_flags.
SPECULATIVE = ("the pack's own speculative decoding settings (bench: bench.num_speculative_tokens with the trained "
               "or bench.drafter drafter; extract: hidden-state capture; datagen serves the target alone)")


class Engine:
    # ---- identity ----------------------------------------------------------------------------
    name: ClassVar[str]

    # ---- serving -----------------------------------------------------------------------------
    # How a stop reaches the server: SIGTERM to the whole process group (False), or to its leader first,
    # which ends its own tree (True).
    stop_leader_first: ClassVar[bool] = False
    # Whether a chat completion can return the sampled token ids (datagen then stores them).
    returns_token_ids: ClassVar[bool] = False
    # Whether a chat completion continues an open last message (`continue_final_message`), an empty user
    # turn included: how datagen.self_prompts has the target write a prompt.
    continues_user_turn: ClassVar[bool] = False
    # The server flag that caps its share of each GPU's memory (a fraction), or None: what lets several
    # servers share a GPU (the benchmark's interleaved schedule).
    gpu_share_flag: ClassVar[str | None] = None
    def with_graph_sizes(self, args: list[str], sizes: list[int]) -> list[str]:
        """`args` (a server's extra_args) with CUDA graphs captured for exactly `sizes` tokens per step,
        where the engine takes such a list and `args` do not choose themselves. Unchanged, by default."""
        return list(args)

    # The server flag that sets its KV cache's size in bytes, or None. Given it, a server needs no memory
    # profiling at start, which another server starting beside it would upset (eagle3/bench/kv_budget.py).
    kv_cache_size_flag: ClassVar[str | None] = None

    def serve_argv(self, env, target, server, extra: list[str] = ()) -> list[str]:
        """The server's command line: target, host, port, dtype, context, TP size, then `extra` (the
        phase's flags) and server.extra_args last."""
        raise NotImplementedError

    def serve_env(self, key: str) -> dict[str, str]:
        """Environment that hands the server its API key (never argv: `ps` shows argv to every user)."""
        raise NotImplementedError

    def readiness(self, server, log: Path) -> list["Probe"]:
        """What must hold before the server counts as ready (the pack adds its own port-owner check)."""
        raise NotImplementedError

    # Where a start's time went, as the engine's own log says it: (step, regex whose group 1 is seconds).
    # Steps may nest (vLLM's engine init includes its compile and graph capture). The first match wins,
    # in log order for one pattern (a speculative server logs a second weight load, its drafter's) and in
    # this order for a step listed twice (a preferred line, then a fallback).
    start_steps: ClassVar[tuple[tuple[str, str], ...]] = ()

    def compile_cache_env(self, path: Path) -> dict[str, str]:
        """Variables that point what the server compiles at `path` (eagle3/engines/compile_cache.py):
        Inductor's and Triton's kernels, which otherwise land in a shared /tmp."""
        return {"TORCHINDUCTOR_CACHE_DIR": str(path / "inductor"), "TRITON_CACHE_DIR": str(path / "triton")}

    def share_across_keys(self, path: Path, shared: Path) -> None:
        """Make what this engine caches under `path` (one key's directory) but does not depend on the
        flags point into `shared` (one per engine version). Nothing, by default."""

    def probe_scratch_env(self, scratch: Path) -> dict[str, str]:
        """Variables for the doctor's probe of this engine (eagle3/engines/probe.py) that have it leave in
        `scratch` what every later start would otherwise work out for itself. Nothing, by default."""
        return {}

    def adopt_probe_output(self, scratch: Path, shared: Path) -> None:
        """Move what the probe left in `scratch` into `shared` (share_across_keys' directory)."""

    # Points of a start that the engine's log only timestamps (its imports, its engine process's spawn):
    # (step, regex whose group 1 is the line's time, that time's strptime format). Each step runs from the
    # previous point found (the launch, for the first) to its own line; a point the log lacks (another
    # version's wording) leaves its time to the next step's. The log's clock has 1 s resolution.
    start_marks: ClassVar[tuple[tuple[str, str, str], ...]] = ()

    def start_breakdown(self, log_text: str, launched_at: float | None = None) -> dict[str, float]:
        """{step: seconds} of one start, from its log (the text after the start's launch line);
        `launched_at` (epoch seconds) adds the start_marks steps."""
        found = {}
        for step, pattern in self.start_steps:
            hit = None if step in found else re.search(pattern, log_text)
            if hit:
                found[step] = float(hit.group(1))
        previous = launched_at
        for step, pattern, fmt in self.start_marks if launched_at is not None else ():
            hit = re.search(pattern, log_text, re.M)
            at = _log_time(hit.group(1), fmt, launched_at) if hit else None
            if at is None:
                continue
            found[step] = round(max(0.0, at - previous), 1)
            previous = max(previous, at)
        return found

    # ---- what it leaves in /dev/shm (the handoff's purge, eagle3/handoff/shm.py) ------------------
    shm_patterns: ClassVar[tuple[str, ...]] = ()     # anchored globs of the segment names it creates
    shm_creator_pid: ClassVar[tuple[str, ...]] = ()  # regexes whose group 1 is the creating PID

    # ---- hidden-state extraction (the extract phase, and the online train step) ----------------
    extracts_hidden_states: ClassVar[bool] = False

    def extraction_server(self, cfg, sup, layer_ids: list[int], dtype: str,
                          storage: Path) -> tuple[list[str], dict[str, str]]:
        """(extra server flags, environment) that make every request write its prompt's hidden states at
        `layer_ids` (the vllm convention) under `storage`."""
        raise NotImplementedError(f"{self.name} does not extract hidden states")

    # ---- speculative decoding and its counters -----------------------------------------------
    acceptance_source: ClassVar[str]  # where a window's acceptance comes from, said in every report

    def spec_args(self, drafter: Path, k: int) -> list[str]:
        """Server flags for target + drafter with k speculative tokens (a chain: one token per step)."""
        raise NotImplementedError

    def scrape(self, url: str, k: int, served_name: str, headers: dict[str, str],
               before: bool = True) -> tuple["SpecCounters | None", "Traffic"]:
        """(spec-decode counters, None without a drafter; traffic counters) from one read of the
        server's metrics. `before`: a snapshot taken before a window (an engine that counts nothing
        until its first verify step may report zeros then)."""
        raise NotImplementedError

    def cross_check(self, url: str, headers: dict[str, str]) -> dict[str, Any]:
        """The engine's own acceptance figure, recorded beside the counters' (not used for verdicts). A
        failure to read it comes back under "cross_check_error": logged by the caller, not recorded."""
        return {}

    version_paths: ClassVar[tuple[str, ...]] = ("/version",)  # where a running server says its version

    # ---- load generator ----------------------------------------------------------------------
    load_client: ClassVar[str]         # its name in reports
    load_client_module: ClassVar[str]  # the module the doctor imports in the engine's environment
    dataset_suffix: ClassVar[str]

    def write_dataset(self, path: Path, texts: list[str]) -> Path:
        raise NotImplementedError

    def open_load_client(self, sup, env_cfg, env: dict[str, str], name: str, log_dir: Path, phase: str,
                         hang_timeout_s: float | None):
        """An object with run(LoadSpec, timeout_s) -> log path and stop(), for one server's windows."""
        raise NotImplementedError

    def load_argv(self, env_cfg, spec: "LoadSpec") -> list[str]:
        """The command line of one load-generator run (engines with a process per window)."""
        raise NotImplementedError

    def parse_load(self, result_file: Path) -> "LoadResult":
        raise NotImplementedError

    # ---- drafters ----------------------------------------------------------------------------
    # The checkpoint layout its loader reads: a key of eagle3/drafters/formats.py's layouts, which
    # decides the weight names, the config format and the aux-layer-id convention.
    drafter_layout: ClassVar[str]
    # Trainer flags a drafter for this engine needs (its loader lacks some of the trainer's norms).
    drafter_train_flags: ClassVar[tuple[str, ...]] = ()

    # ---- what the pack sets itself (eagle3/managed.py) ---------------------------------------
    # Server flag spellings -> the config field the pack sets them from, beyond every engine's own.
    managed_flags: ClassVar[dict[tuple[str, ...], str]] = {}
    managed_env: ClassVar[dict[str, str]] = {}  # variables the pack sets in this engine's processes
    # Variables a server of this engine gets unless engines.<name>.env sets them (the user's value wins).
    server_env_defaults: ClassVar[dict[str, str]] = {}
    remote_env: ClassVar[str | None] = None  # a variable that binds internal ports (loopback unless allow_remote)

    # ---- probes (eagle3/engines/probe.py, run in the engine's environment) -------------------
    # The packages whose installed version is the engine's version (the first one found).
    distributions: ClassVar[tuple[str, ...]] = ()
    # The script in eagle3/engine_side/ that inspects the target inside the engine's interpreter, where this
    # object is not importable (inspect_target.py says what it answers), or None: the doctor then warns
    # that the engine's versions and its support for the target are first seen when its server starts.
    inspect_script: ClassVar[str | None] = None
    optional_serve_flags: ClassVar[tuple[str, ...]] = ()  # flags some releases lack; the probe asks its parser

    def __repr__(self) -> str:
        return f"<engine {self.name}>"


def _log_time(text: str, fmt: str, near: float) -> float | None:
    """Epoch seconds of a log line's local time; a format without the year takes `near`'s."""
    if "%Y" not in fmt:
        text, fmt = f"{time.localtime(near).tm_year} {text}", f"%Y {fmt}"
    try:
        return time.mktime(time.strptime(text, fmt))
    except (ValueError, OverflowError):
        return None
