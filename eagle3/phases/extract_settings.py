"""The extract phase's config section (`extract:`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from ..config.target_model import default_aux_layer_ids, num_hidden_layers
from .. import engine_registry
from ..config.types import EngineName, PhaseSettings, Server
from ..errors import ConfigError, echo


class Extract(PhaseSettings):
    FINGERPRINT_ALSO = ("hidden_states",)

    engine: EngineName = Field(engine_registry.DEFAULT, description=(
        "The engine that extracts hidden states: one whose module says it can (`extracts_hidden_states`)."))
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

    @field_validator("engine")
    @classmethod
    def _extracts(cls, v):
        if not engine_registry.get(v).extracts_hidden_states:
            able = [n for n in engine_registry.names() if engine_registry.get(n).extracts_hidden_states]
            raise ValueError(f"{v} cannot extract hidden states; use one that can: {', '.join(able)}")
        return v

    @field_validator("aux_layer_ids")
    @classmethod
    def _distinct(cls, v):
        if v is not None:
            if len(v) < 1:
                raise ValueError("give at least one layer id, or leave it unset for the default (2, L//2, L-3)")
            if len(set(v)) != len(v):
                raise ValueError(f"layer ids must be distinct, got {echo(v)}")
        return v

    def checks(self, cfg) -> list[tuple[str, str]]:
        return speculators_needed(cfg)

    def file_checks(self, cfg) -> list[tuple[str, str]]:
        try:
            layers = num_hidden_layers(cfg.target.model)
        except ConfigError:  # listed by the target's own check
            return []
        if not layers:
            return []
        if self.aux_layer_ids:
            bad = [i for i in self.aux_layer_ids if i >= layers]
            if bad:
                return [("extract.aux_layer_ids", f"{echo(bad)} out of range for a target with {layers} layers "
                         f"(valid: 0..{layers - 1}; the last layer is added by include_last_layer)")]
            return []
        default = default_aux_layer_ids(layers)
        if len(set(default)) != len(default) or not all(0 <= i < layers for i in default):
            # vLLM would silently de-duplicate them and die on a shape mismatch (docs/FACTS.md §4)
            return [("extract.aux_layer_ids", f"unset, and the default (2, L//2, L-3) = {default} is not three "
                     f"distinct layers of this {layers}-layer target; set it explicitly (ids 0..{layers - 1}, e.g. "
                     f"{[max(0, layers - 3), max(0, layers - 2), layers - 1]})")]
        return []


def speculators_needed(cfg) -> list[tuple[str, str]]:
    if cfg.engines.speculators is None:
        return [("engines.speculators", "extraction and training run the speculators CLI; set engines.speculators")]
    return []
