"""Which of speculators' training kernels work with the installed speculators and torch.

speculators' defaults (fused Triton loss, flex attention) are chosen upstream for its own CI's torch.
Combinations seen to fail are listed here with what they printed; `train.loss_implementation` and
`train.draft_attn_impl` at `auto` avoid them, and the doctor refuses them when set explicitly.
The versions come from the speculators environment itself (engine_side/engine_versions.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import PipelineConfig
from ..process.services import Supervisor
from .probe import engine_probe

FLAGS = {"loss_implementation": "--loss-implementation", "draft_attn_impl": "--draft-attn-impl"}


@dataclass(frozen=True)
class KnownBad:
    speculators: str          # exact version
    torch_prefix: str         # e.g. "2.11." (local builds such as +cu130 included)
    setting: str              # the train.* field whose speculators default fails
    failing: str              # the value that fails
    works: dict               # what trained there instead (all fields)
    seen: str                 # what it printed, where

    def matches(self, versions: dict) -> bool:
        return (versions.get("speculators") == self.speculators
                and str(versions.get("torch", "")).startswith(self.torch_prefix))

    def describe(self, versions: dict) -> str:
        return (f"speculators {versions.get('speculators')} with torch {versions.get('torch')}: "
                f"{FLAGS[self.setting]} {self.failing} fails ({self.seen})")


KNOWN_BAD = (
    KnownBad("0.9.0", "2.11.", "loss_implementation", "fused",
             {"loss_implementation": "eager", "draft_attn_impl": "sdpa"},
             "torch.compile: `AssertionError: ListVariable(length=21) is already tracked for mutation` in "
             "speculators/losses/fused.py, on an H200 with torch 2.11.0+cu130, 2026-12-01; the tiny fixture drafter "
             "trained there with --loss-implementation eager --draft-attn-impl sdpa"),
)


def trainer_versions(cfg: PipelineConfig, sup: Supervisor) -> dict:
    if cfg.engines.speculators is None:
        return {}
    return engine_probe(cfg, sup, "speculators", "engine_versions.py").get("versions") or {}


def known_bad(versions: dict) -> KnownBad | None:
    return next((k for k in KNOWN_BAD if k.matches(versions)), None)


def resolve(cfg: PipelineConfig, versions: dict) -> dict[str, str | None]:
    """Each setting's value to pass (None: leave speculators' default). `auto` takes the working
    values of a known-bad combination, else speculators' default."""
    bad = known_bad(versions)
    out: dict[str, str | None] = {}
    for field in FLAGS:
        chosen = getattr(cfg.train, field)
        if chosen == "auto":
            out[field] = bad.works[field] if bad else None
        else:
            out[field] = chosen
    return out


def trainer_flags(cfg: PipelineConfig, versions: dict) -> list[str]:
    return [arg for field, value in resolve(cfg, versions).items() if value is not None
            for arg in (FLAGS[field], value)]


def conflict(cfg: PipelineConfig, versions: dict) -> str | None:
    """Why the configured settings are known to fail with these versions, naming the fix; or None."""
    bad = known_bad(versions)
    if bad is None or getattr(cfg.train, bad.setting) != bad.failing:
        return None
    fix = ", ".join(f"train.{f}: {v}" for f, v in bad.works.items())
    return f"train.{bad.setting}: {bad.describe(versions)}. Fix: set {fix} (or leave them at auto)"
