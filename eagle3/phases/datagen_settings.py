"""The datagen phase's config section (`datagen:`)."""

from __future__ import annotations

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


class Datagen(PhaseSettings):
    PATH_FIELDS = ("prompts",)
    FINGERPRINT_EXCLUDE = {"server": {"api_key"}}

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

    def file_checks(self, cfg) -> list[tuple[str, str]]:
        if why := file_problem(self.prompts):
            return [("datagen.prompts", f"{str(self.prompts)!r} {why}; give a JSONL prompt set file")]
        return []
