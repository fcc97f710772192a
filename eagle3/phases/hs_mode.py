"""Offline or online hidden states: estimate the offline cache, look at the free disk, choose.

offline: phase 2 writes every sample's hidden states (hs_{i}.safetensors), training reads them.
The files take bytes_per_token × tokens + one safetensors header per sample (extract_disk.py;
8·H B/token at 4 layers × bf16, so a 8K-token Llama-8B sample is ~268 MB and 50K samples ~13 TB).
online: the train phase runs the extraction server beside the trainer; each sample's file lives
in the on-demand cache only until the trainer has loaded it (speculators' `--on-missing
generate`, which deletes it), so the cache holds at most the samples in flight.

`auto` chooses offline when the estimate fits the free space under run_dir with
hidden_states.disk_margin to spare (and within extract.max_disk_bytes), online otherwise; when
neither fits (online needs two GPU sets, and room for its cache bound) it refuses with the numbers.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import managed, owned
from . import products
from ..config import PipelineConfig
from ..errors import ConfigError
from ..prompts import load_prompts, tokens_at_most
from .extract_disk import (HEADER_BYTES, Estimate, bytes_per_token, estimate_from_samples, exact_estimate, fmt_bytes)

SPECULATORS_DEFAULT_WORKERS = 12  # speculators train --num-workers default (0.9)
CACHE_SLACK = 4                   # the cache bound = this × samples in flight × the largest sample


class NoModeFits(ConfigError):
    """Neither offline (disk) nor online (GPU sets, cache room) fits this machine."""



@dataclass(frozen=True)
class Decision:
    requested: str          # hidden_states.mode
    mode: str               # offline | online
    offline_bytes: int      # the estimate of the offline cache
    estimate: str           # how it was computed
    free_bytes: int         # free space under run_dir
    usable_bytes: int       # free × (1 - disk_margin), capped by extract.max_disk_bytes
    cache_bound: int        # the online cache's bound
    online_problem: str | None  # why online cannot run here, or None
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        return (f"{self.mode} ({'chosen by auto' if self.requested == 'auto' else 'forced'}): offline cache "
                f"{fmt_bytes(self.offline_bytes)}, free under run_dir {fmt_bytes(self.free_bytes)}; {self.reason}")


# ---- the estimate -----------------------------------------------------------------------------------

def per_token_bytes(cfg: PipelineConfig) -> int:
    from .extract_manifest import DTYPE_BYTES, extraction_dtype, resolve_layer_plan

    plan = resolve_layer_plan(cfg)
    return bytes_per_token(len(plan.layer_ids), plan.hidden_size, DTYPE_BYTES[extraction_dtype(cfg)])


def offline_estimate(cfg: PipelineConfig) -> Estimate:
    """The best estimate available now: exact from the prepared data once phase 2 prepared it, from
    phase 1's token counts once it ran, else from the prompts and the sampling (before_datagen)."""
    per_token = per_token_bytes(cfg)
    index = read_prepared_index(cfg)
    if index is not None:
        return exact_estimate(len(index["seq_len"]), sum(index["seq_len"]), per_token)
    samples = products.samples(cfg)
    if samples.is_file() and samples.stat().st_size:
        return estimate_from_samples(samples, cfg.extract.seq_length, per_token)
    return before_datagen(cfg, per_token)


def before_datagen(cfg: PipelineConfig, per_token: int) -> Estimate:
    """Before phase 1, from the prompts and the sampling: each row at most its conversation's bytes, the
    template and datagen.sampling.max_tokens (prompts.tokens_at_most), capped at extract.seq_length;
    prepare-data makes one row per assistant turn. Not a bound the phase relies on: the check runs again
    on phase 1's token counts, and exactly after prepare-data, before any hidden state is written. Every
    sample at seq_length, as before, overstated a 256-token profile's 8,192 samples 3.5x, and its
    preflight refused a run that fitted (bench/RESULTS.md, 2026-12-05)."""
    rows = tokens = 0
    for prompt in load_prompts(cfg.datagen.prompts, cfg.datagen.max_samples, skip_invalid=True).prompts:
        text = sum(len(str(m.get("content") or "").encode()) for m in prompt.messages)
        turns = 1 + sum(m.get("role") == "assistant" for m in prompt.messages)
        rows += turns
        tokens += turns * tokens_at_most(text, cfg.datagen.sampling.max_tokens, cfg.extract.seq_length)
    if sp := cfg.datagen.self_prompts:  # a written user turn is at most its max_tokens tokens
        rows += sp.count
        tokens += sp.count * tokens_at_most(sp.max_tokens, cfg.datagen.sampling.max_tokens, cfg.extract.seq_length)
    return Estimate(rows, tokens, per_token, tokens * per_token + rows * HEADER_BYTES, 0, exact=False,
                    basis="prompts and datagen.sampling.max_tokens")


def read_prepared_index(cfg: PipelineConfig) -> dict | None:
    try:
        data = owned.read_json(cfg.layout.prepared_index, what="prepared-data index")
        return data if isinstance(data, dict) and isinstance(data.get("seq_len"), list) else None
    except (OSError, ValueError, AttributeError):
        return None


# ---- online: samples in flight and the cache bound ----------------------------------------------------

def loader_workers(extra_args: list[str]) -> int:
    """The trainer's --num-workers as train.extra_args set it (the last one wins), else its default."""
    value = managed.flag_value(list(extra_args), "--num-workers")
    workers = int(value) if value is not None and value.isdigit() else SPECULATORS_DEFAULT_WORKERS
    return workers


def samples_in_flight(cfg: PipelineConfig) -> int:
    """Each data-loader worker has at most one sample between the server's write and its own delete;
    the trainer keeps a train and a validation loader (persistent workers) on every rank."""
    ranks = max(1, len(cfg.hidden_states.train_gpus))
    return ranks * 2 * max(1, loader_workers(list(cfg.train.extra_args)))


def cache_bound(cfg: PipelineConfig, largest_sample_bytes: int | None = None) -> int:
    if cfg.hidden_states.cache_max_bytes is not None:
        return cfg.hidden_states.cache_max_bytes
    largest = largest_sample_bytes or cfg.extract.seq_length * per_token_bytes(cfg) + HEADER_BYTES
    return CACHE_SLACK * samples_in_flight(cfg) * largest


def online_problem(cfg: PipelineConfig) -> str | None:
    hs = cfg.hidden_states
    if cfg.cpu_rehearsal:
        return None  # both processes on the CPU
    if not (hs.server_gpus and hs.train_gpus):
        return (f"online needs two GPU sets (server and trainer side by side); set hidden_states.server_gpus and "
                f"hidden_states.train_gpus to disjoint subsets of gpus {cfg.gpus}")
    return None


# ---- the choice ------------------------------------------------------------------------------------

def free_bytes(run_dir: Path) -> tuple[int, Path]:
    where = Path(run_dir).absolute()
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free, where


def decide(cfg: PipelineConfig, estimate: Estimate, free: int, largest_sample_bytes: int | None = None) -> Decision:
    """Offline when it fits with the margin, else online when it can run; NoModeFits otherwise (and
    for a forced mode that cannot run). `free` counts what is already written as still free."""
    hs = cfg.hidden_states
    usable = int(free * (1 - hs.disk_margin))
    limit = cfg.extract.max_disk_bytes
    if limit is not None:
        usable = min(usable, limit)
    bound = cache_bound(cfg, largest_sample_bytes)
    problem = online_problem(cfg)
    if problem is None and bound > usable:
        problem = (f"the online cache bound {fmt_bytes(bound)} does not fit either; lower hidden_states.cache_max_bytes "
                   "or the trainer's --num-workers")
    fits = estimate.bytes <= usable
    margin = f"free × (1 - {hs.disk_margin:g})" + (f", capped by extract.max_disk_bytes {limit}" if limit else "")
    base = dict(requested=hs.mode, offline_bytes=estimate.bytes, estimate=estimate.describe(), free_bytes=free,
                usable_bytes=usable, cache_bound=bound, online_problem=problem)
    if hs.mode == "offline" or (hs.mode == "auto" and fits):
        why = f"it fits: {fmt_bytes(estimate.bytes)} ≤ {fmt_bytes(usable)} usable ({margin})" if fits else \
              f"forced, though {fmt_bytes(estimate.bytes)} > {fmt_bytes(usable)} usable ({margin})"
        return Decision(mode="offline", reason=why, **base)
    if problem is None:
        why = "forced" if hs.mode == "online" else \
              f"offline does not fit: {fmt_bytes(estimate.bytes)} > {fmt_bytes(usable)} usable ({margin})"
        return Decision(mode="online", reason=f"{why}; on-demand cache bounded at {fmt_bytes(bound)}", **base)
    head = "hidden_states.mode online cannot run" if hs.mode == "online" else "neither hidden-state mode fits"
    raise NoModeFits(f"{head}: offline needs {fmt_bytes(estimate.bytes)} ({estimate.describe()}) but run_dir has "
                     f"{fmt_bytes(free)} free ({fmt_bytes(usable)} usable: {margin}); online: {problem}. Free disk "
                     "under run_dir, or configure hidden_states.server_gpus/train_gpus, or use fewer samples")


def decide_now(cfg: PipelineConfig) -> Decision:
    estimate = offline_estimate(cfg)
    free, _ = free_bytes(cfg.run_dir)
    return decide(cfg, estimate, free)
