"""The datagen phase's config section (`datagen:`)."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field, field_validator

from ..config.types import EngineName, FsPath, PhaseSettings, PositiveFloat, Server, Strict, non_finite
from .. import engine_registry
from ..inputfiles import file_problem


class Sampling(Strict):
    temperature: float = Field(0.6, ge=0, description="Sampling temperature of the generated answers.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling of the generated answers.")
    max_tokens: int = Field(2048, gt=0, description="Longest answer (vLLM clamps it to `max_model_len`).")
    seed: int | None = Field(0, description="Base seed; each prompt's seed is derived from it and the prompt id, "
                                            "so a resumed run generates the same text.")

    def seed_for(self, key: str) -> int | None:
        """A request's seed: the base seed plus its key's hash (datagen's SEED_POLICY)."""
        if self.seed is None:
            return None
        return (self.seed + int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)) % (2 ** 31)


class SelfPrompts(Strict):
    count: int = Field(gt=0, description=(
        "Prompts the target writes itself, besides the prompt set's (ids `self-00000` on): the chat template up "
        "to an open user turn, sampled (Magpie), then answered like a prompt of the set."))
    temperature: float = Field(1.0, ge=0, description="Sampling temperature of the written user turns.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling of the written user turns.")
    max_tokens: int = Field(256, gt=0, description="Longest user turn; one cut off here is drawn again.")
    system: str | None = Field(None, min_length=1, description=(
        "A system turn the prompts are written under, in place of the template's default: what the assistant is "
        "for, which steers what it expects to be asked. Their answers are generated without it, as served."))
    draws: int = Field(4, ge=1, description=(
        "Draws per prompt: a user turn that is cut off, empty, already written, or one of the benchmark's "
        "prompts is drawn again with another seed; after this many the prompt counts as failed."))


class Datagen(PhaseSettings):
    PATH_FIELDS = ("prompts",)
    FINGERPRINT_EXCLUDE = {"server": {"api_key"}}
    FINGERPRINT_UNSET = ("self_prompts",)

    engine: EngineName = Field(engine_registry.DEFAULT, description="The engine that serves the target.")
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
    self_prompts: SelfPrompts | None = Field(None, description=(
        "The target also writes prompts of its own (`datagen.self_prompts`): data drawn from what it expects to "
        "be asked, for a prompt set too narrow or too small; off unless set."))
    skip_invalid_prompts: bool = Field(False, description=(
        "Skip malformed prompt rows (logged) instead of stopping the phase before it starts."))
    # Beyond this share of the set without a sample, the phase fails instead of passing a thin data set on.
    max_failed_fraction: float = Field(0.01, ge=0, le=1, description=(
        "Share of the prompts that may end without a sample (the server rejected them, e.g. longer than "
        "`max_model_len`; reasons in failures.jsonl); beyond it the phase fails and a rerun retries only those."))

    @field_validator("request_extra")
    @classmethod
    def _no_owned_keys(cls, v):
        if non_finite(v):
            raise ValueError("holds inf or nan, which JSON cannot carry; use a finite number")
        owned = sorted(set(v) & {"model", "messages", "stream", "n"})
        if owned:
            raise ValueError(f"{owned} are set by the pack; remove them from request_extra")
        sampling = sorted(set(v) & {"temperature", "top_p", "max_tokens", "max_completion_tokens", "seed"})
        if sampling:
            raise ValueError(f"{sampling} belong under datagen.sampling; move them there")
        return v

    def checks(self, cfg) -> list[tuple[str, str]]:
        if self.self_prompts is None or engine_registry.get(self.engine).continues_user_turn:
            return []
        able = [n for n in engine_registry.names() if engine_registry.get(n).continues_user_turn]
        return [("datagen.self_prompts", f"{self.engine}'s chat endpoint is not known to continue an open user turn, "
                                         f"which writing prompts needs: remove self_prompts, or set datagen.engine to "
                                         f"{' or '.join(able)}")]

    def file_checks(self, cfg) -> list[tuple[str, str]]:
        if why := file_problem(self.prompts):
            return [("datagen.prompts", f"{str(self.prompts)!r} {why}; give a JSONL prompt set file")]
        return []
