"""The bench phase's config section (`bench:`, with `bench.watch` and `bench.parity`)."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator

from .. import managed, phase_table
from ..config.types import EngineName, FsPath, PhaseSettings, PositiveFloat, Server, Strict
from .. import engine_registry
from ..errors import echo
from ..inputfiles import dir_problem, file_problem

# The most of each GPU's memory the interleaved schedule's servers may claim together: what is left is
# the CUDA contexts' own and the allocator's slack (vLLM's default for one server is 0.9).
SHARED_GPU_BUDGET = 0.9


class BenchWatch(Strict):
    """Comparison of each benchmark result with the run dir's bench-history (eagle3/bench/watch.py): the
    drafter judged by its acceptance and paired speedup, absolute speed against the setup's between-run noise."""

    enabled: bool = Field(True, description="Compare each result with the run dir's bench history.")
    fail_on_regression: bool = Field(True, description=(
        "A decided drafter regression fails the phase (exit 1), and a decided engine regression the scheduled "
        "rerun (flows/benchmark.py); false: only reported. Node drift and undecided figures never fail."))
    acceptance_tolerance_pct: float = Field(3.0, ge=0, description=(
        "An acceptance figure (length, each position) worse by more than this many percent, and beyond what "
        "reruns of the setup varied by, is a drafter regression. Greedy reruns of the same prompts repeat the "
        "counters exactly."))
    speed_tolerance_pct: float = Field(5.0, ge=0, description=(
        "A speed figure (a paired speedup, a server's throughput or TPOT) must be worse by more than this many "
        "percent, besides beyond its noise, to be judged worse."))
    min_noise_runs: int = Field(3, ge=2, description=(
        "Earlier good runs of the setup needed before absolute throughput and TPOT are judged against their "
        "spread (the between-run noise); until then they are reported, not judged."))


class BenchParity(Strict):
    """Serve-parity gate: the drafter served on a sample of the prompts its validation accuracy was measured
    on (else of its training prompts) must come close to what training measured (eagle3/bench/gates.py)."""

    enabled: bool = Field(True, description="Serve the drafter on a sample of its validation prompts (its "
                                            "training record names them; else its training prompts) and compare "
                                            "with what training measured.")
    prompts: int = Field(16, ge=1, description="Prompts in the sample, spread evenly over the drafter's validation "
                                               "rows (else over the rows data generation used).")
    # A drafter broken between training and serving gives ~0; the sound fixture drafter, greedy on CPU, 0.35-0.41 (eagle3/bench/gates.py).
    min_fraction: float = Field(0.3, gt=0, le=1, description=(
        "Measured (acceptance length - 1) must reach this share of training's expectation."))
    expected_full_acc: list[Annotated[float, Field(ge=0, le=1)]] | None = Field(None, description=(
        "Training's per-position validation accuracy (speculators' val/full_acc_i_epoch). Default: the train "
        "manifest's `val_full_acc` (recorded by a GPU run); set it for a `bench.drafter`."))


class Bench(PhaseSettings):
    PATH_FIELDS = ("prompts", "drafter")
    # The benchmark's checks (watch, parity, first-position floor) came later, and re-judge its
    # measurements rather than change them: left out, so adding them changed no fingerprint.
    # How servers start changes when they are ready, not what they measure.
    FINGERPRINT_EXCLUDE = {"watch": True, "parity": True, "first_position_floor": True, "start_servers": True}

    engine: EngineName = Field(engine_registry.DEFAULT, description="The engine benchmarked.")
    server: Server = Field(description="The benchmark's servers, one per k (`*.server` below).")
    num_speculative_tokens: list[Annotated[int, Field(ge=1, le=16)]] = Field(
        default_factory=lambda: [3], description="Each k measured against the baseline; distinct, sorted.")
    concurrency: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [1, 4, 16], description="Each concurrency measured (`windows` windows each); "
                                                        "distinct, sorted.")
    windows: int = Field(3, ge=1, le=50, description=(
        "Windows per (server, concurrency), interleaved over the concurrencies. A speed figure is their mean "
        "with a t interval; a speedup is decided (faster / not faster) only when its interval excludes 1, so "
        "1 window leaves every speed verdict undecided. Cost: each window is num_prompts requests."))
    schedule: Literal["sequential", "interleaved", "alternating"] = Field("sequential", description=(
        "`sequential`: one server at a time (baseline, then each k), with a GPU handoff between two. "
        "`interleaved`: every server of a round runs at once, each on its own port (`server.port`, then the "
        "next ports up), and the windows take turns (baseline, k..., baseline, k... per window), so drift "
        "in the machine hits every config alike and each speedup is judged on paired windows. On GPUs each "
        "server must then be capped so that all fit: the engine's memory-share flag in `server.extra_args`. "
        "`alternating`: the servers of `interleaved`, but within each window slot they take turns request by "
        "request (at concurrency c, c requests at a time), the first of each turn rotating, so all meet the "
        "machine within the same second; the pack's own streaming client sends them (not the engine's load "
        "generator). On one H100, real SmolLM2 target, 160 held-out requests per server, an A/A pair's interval "
        "was ±1.98 % this way against ±5.48 % in blocks of 8 requests (one probe run, bench/RESULTS.md, 2026-12-05). "
        "It can lose: on a 2-core CPU box, three vLLM CPU servers of the real SmolLM2, held-out prompts, the pack's "
        "twin came to ±14-16 % alternating against ±2.5-3.2 % interleaved (two runs each; half-widths); a server idle 1-1.5 s "
        "between its turns answered its first token ~1 s late almost every time, one idle 1.5-2 s about half "
        "the time (bench/RESULTS.md, 2026-12-05). Set `aa_twin` to see which holds on your machine."))
    max_windows: int | None = Field(None, ge=2, le=50, description=(
        "With schedule interleaved or alternating: keep adding window slots after `windows` until every "
        "speedup's 95 % interval is decided (wholly above or below 1) or within ±`target_halfwidth_pct`, and the baseline twin's within "
        "it, at every concurrency; at most this many slots. Unset: exactly `windows`. Cost: up to "
        "(max_windows - windows) more slots, each one window per server per concurrency."))
    target_halfwidth_pct: float = Field(3.0, gt=0, le=50, description=(
        "With `max_windows`: the half-width, in percent, at which a paired speedup's interval is narrow enough."))
    aa_twin: bool = Field(False, description=(
        "With schedule interleaved or alternating: a second baseline server beside the others, measured in "
        "every window slot like them. Its paired ratio to the baseline is an A/A check in every run (it must show no change), and "
        "that interval's half-width is the machine's noise floor for a paired speedup. Cost: one more server."))
    start_servers: Literal["one_by_one", "side_by_side"] | None = Field(None, description=(
        "With schedule interleaved or alternating: how a round's servers start. `side_by_side`: all at once, "
        "the baseline's twin as soon as the baseline is ready (so that it reuses the baseline's compile cache), each with a KV cache "
        "the pack sizes for the benchmark's own requests (vLLM's --kv-cache-memory-bytes): an engine that sizes "
        "it by profiling at start would count the other servers' memory as its own. A round then starts in about "
        "its slowest server's time instead of the sum of all. `one_by_one`: in turn. Unset: side_by_side where "
        "the engine takes a KV cache size (vLLM) and the target's config.json gives its attention's shape, else "
        "one_by_one."))
    rounds: int = Field(1, ge=1, le=10, description=(
        "Times the whole server sequence (baseline, each k) is started and measured, in A B A B order, so "
        "drift and server-start noise show in the intervals instead of posing as a difference; from 2 the "
        "report also checks that the rounds agree (A/A). Cost: one server start per server per round."))
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

    def needs_upstream(self) -> bool:
        return self.drafter is None  # a drafter of its own: the train phase's output is not read

    def server_ports(self) -> list[int]:
        """One port per server of a round: all on `server.port` when sequential; interleaved, the
        baseline on it and each k on the next ports up, in bench.num_speculative_tokens order, then the
        baseline's twin (aa_twin)."""
        n = 1 + len(self.num_speculative_tokens) + self.aa_twin if self.all_at_once else 1
        return [self.server.port + i for i in range(n)]

    @property
    def all_at_once(self) -> bool:
        """Whether a round's servers run at once (schedule interleaved or alternating)."""
        return self.schedule != "sequential"

    def side_by_side(self) -> bool:
        """Whether an interleaved round starts its servers at once (bench.start_servers, or its default)."""
        if not self.all_at_once or self.start_servers == "one_by_one":
            return False
        return self.start_servers == "side_by_side" or engine_registry.get(self.engine).kv_cache_size_flag is not None

    def borrowed_ports(self, cfg) -> list[int]:
        return self.server_ports()[1:]  # the interleaved schedule's other servers: proven free like its own

    def checks(self, cfg) -> list[tuple[str, str]]:
        if not self.all_at_once:
            problems = [("bench.aa_twin", "the baseline's twin is measured beside the others, which only the "
                                          "interleaved and alternating schedules do: set bench.schedule: interleaved "
                                          "or alternating, or remove aa_twin")] if self.aa_twin else []
            if self.max_windows is not None:
                problems.append(("bench.max_windows", "more windows until the intervals are narrow need every server "
                                                      "up at once, which only the interleaved and alternating "
                                                      "schedules do: set bench.schedule: interleaved or alternating, "
                                                      "or remove max_windows"))
            if self.start_servers == "side_by_side":
                problems.append(("bench.start_servers", "the sequential schedule runs one server at a time, with a "
                                                        "GPU handoff between two: set bench.schedule: interleaved or "
                                                        "alternating, or remove start_servers"))
            return problems
        problems = []
        if self.start_servers == "side_by_side" and engine_registry.get(self.engine).kv_cache_size_flag is None:
            problems.append(("bench.start_servers", f"{self.engine} sizes its memory pool from the GPU memory it finds "
                                                    "free at start, which a server starting beside it changes, and "
                                                    "no flag of it sets the pool's size instead: set "
                                                    "start_servers: one_by_one"))
        if self.max_windows is not None and self.max_windows < max(self.windows, 2):
            problems.append(("bench.max_windows", f"{self.max_windows} is below bench.windows ({self.windows}); it is the "
                                                  f"most window slots: set it to at least {max(self.windows, 2)}"))
        if self.max_windows is not None and self.windows < 2:
            problems.append(("bench.windows", "an interval needs 2 window slots before it can be narrow enough: set "
                                              "bench.windows to at least 2 with max_windows"))
        extra = self.server_ports()[1:]
        if extra[-1] > 65535:
            problems.append(("bench.server.port", f"the interleaved schedule needs ports {self.server.port}-"
                                                  f"{extra[-1]}, beyond 65535: lower bench.server.port"))
        taken = {server.port: f"{name}.server.port" for name, server, _ in phase_table.servers(cfg) if name != "bench"}
        taken.update({port: "handoff.extra_ports" for port in cfg.handoff.extra_ports})
        for port in extra:
            if port in taken:
                problems.append(("bench.server.port", f"the interleaved schedule serves {self._server_on(port)} on "
                                 f"port {port}, which is also {taken[port]}: move bench.server.port so that "
                                 f"{self.server.port}-{extra[-1]} are its own"))
        if cfg.gpus:
            problems += self._gpu_share_problems()
        return problems

    def _server_on(self, port: int) -> str:
        i = port - self.server.port - 1
        return f"k={self.num_speculative_tokens[i]}" if i < len(self.num_speculative_tokens) else "the baseline's twin"

    def _gpu_share_problems(self) -> list[tuple[str, str]]:
        """On GPUs every server of a round holds memory at once: each must be capped, and all must fit."""
        n, flag = len(self.server_ports()), engine_registry.get(self.engine).gpu_share_flag
        where = "bench.server.extra_args"
        fair = math.floor(SHARED_GPU_BUDGET / n * 100) / 100  # rounded down: n times it stays within the budget
        if flag is None:
            return [("bench.schedule", f"{self.engine} has no flag that caps a server's share of a GPU, so {n} servers "
                                       "cannot be proven to fit at once: use schedule: sequential")]
        raw = managed.flag_value(list(self.server.extra_args), flag)
        if raw is None:
            return [(where, f"the interleaved schedule runs {n} servers on each GPU at once, and without {flag} each "
                            f"would claim the engine's default share: add [{flag}, '{fair:.2f}'] "
                            f"(at most {SHARED_GPU_BUDGET:g} / {n} servers), or use schedule: sequential")]
        try:
            share = float(raw)
        except ValueError:
            return [(where, f"{flag} {echo(raw)} is not a number")]
        if not 0 < share * n <= SHARED_GPU_BUDGET:
            return [(where, f"{flag} {share:g} x {n} servers = {share * n:.2f} of each GPU, over "
                            f"{SHARED_GPU_BUDGET:g}: set it to at most {fair:.2f}, benchmark fewer k "
                            "at once, or use schedule: sequential")]
        return []

    def file_checks(self, cfg) -> list[tuple[str, str]]:
        problems = []
        # A saved dataset directory is a prompt set too (eagle3/prompts/sets.py).
        if self.prompts is not None and (why := file_problem(self.prompts)) and dir_problem(self.prompts):
            problems.append(("bench.prompts", f"{str(self.prompts)!r} {why}; give a prompt set file (JSONL, JSON, "
                             "parquet) or a saved dataset directory, or remove the key to benchmark on the prompts "
                             "data generation held out"))
        drafter = self.drafter
        if drafter is not None and (
                why := dir_problem(drafter) or prefixed("its config.json", file_problem(drafter / "config.json"))):
            problems.append(("bench.drafter", f"{str(drafter)!r} is not a drafter checkpoint dir ({why}); point it "
                             "at one, or remove the key to serve the train phase's drafter"))
        return problems


def prefixed(prefix: str, why: str | None) -> str | None:
    return f"{prefix} {why}" if why else None
