"""The train phase's config section (`train:`), and the rules of the online step, which runs the
extraction server and the trainer side by side (hidden_states.server_gpus / train_gpus)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .. import managed
from ..config.types import PhaseSettings, PositiveFloat
from ..errors import echo
from .extract_settings import speculators_needed


class Train(PhaseSettings):
    FINGERPRINT_ALSO = ("hidden_states",)

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

    def checks(self, cfg) -> list[tuple[str, str]]:
        twice = "a second value silently wins or loses"
        problems = [(f"train.extra_args[{i}]", f"{echo(arg)} is also set by the pack, from {owner}; {twice}: "
                                               "remove it from extra_args")
                    for i, arg, owner in managed.flag_conflicts(list(self.extra_args), managed.TRAIN_FLAGS)]
        return problems + speculators_needed(cfg) + _online_gpu_sets(cfg)

    def borrowed_ports(self, cfg) -> list[int]:
        # Unless offline, the train step may run the extraction server beside the trainer.
        return [cfg.extract.server.port] if cfg.hidden_states.mode != "offline" else []


SHARED_GPU_FRACTION = 0.5  # the most of a GPU's memory an extraction server may take beside the trainer


def _no_room_to_share(cfg) -> str | None:
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


def _online_gpu_sets(cfg) -> list[tuple[str, str]]:
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
    spans = cfg.target.tensor_parallel_size * cfg.target.data_parallel_size
    if hs.server_gpus and spans > len(hs.server_gpus):
        problems.append(("hidden_states.server_gpus", f"{len(hs.server_gpus)} GPU(s) for a target with "
                                                      f"tensor_parallel_size {cfg.target.tensor_parallel_size} and "
                                                      f"data_parallel_size {cfg.target.data_parallel_size}"))
    if hs.mode == "online" and cfg.gpus and not (hs.server_gpus and hs.train_gpus):
        problems.append(("hidden_states.mode", "online needs two GPU sets: set hidden_states.server_gpus and "
                                               "hidden_states.train_gpus (disjoint subsets of 'gpus')"))
    return problems
