"""Which target layers phase 2 extracts, and the manifest that pins them for every later phase.

Layer ids follow vLLM's / speculators' convention ("vllm"): id k is the hidden state ENTERING
decoder layer k, i.e. the output of layer k-1 (Hugging Face `output_hidden_states[k]`); id L (the
layer count) is the output of the last decoder layer BEFORE the final norm. SGLang/SpecForge
configs name the same tensor k-1 (docs/FACTS.md §2), so an id is meaningless without its
convention: both are written into run_dir/extract/manifest.json, and training and benchmark read
them from there (read_extract_manifest) instead of recomputing them from the config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..config import PipelineConfig, default_aux_layer_ids, num_hidden_layers
from ..drafters.formats import LAYER_INPUT
from ..errors import ConfigError, PipelineError
from ..layout import EXTRACT_MANIFEST
from ..fsio import atomic_write_json, read_json

PHASE = "extract"
MANIFEST_SCHEMA = 1
CONVENTION = LAYER_INPUT
CONVENTION_NOTE = ("id k = hidden state entering decoder layer k (= output of layer k-1, HF output_hidden_states[k]); "
                   "id L = output of the last decoder layer before the final norm; SGLang/SpecForge name the same "
                   "tensor k-1")
FILE_PATTERN = "hs_{i}.safetensors"
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# ---- the layer plan --------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerPlan:
    num_hidden_layers: int
    hidden_size: int
    aux_layer_ids: tuple[int, ...]   # what the drafter's fc fuses (training's --target-layer-ids)
    last_layer_id: int | None        # L when include_last_layer (speculators' verifier_last_hidden_states)
    source: str                      # "config" (extract.aux_layer_ids) or "default" (2, L//2, L-3)

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """All extracted ids, in file order: hidden_states[:, i] is layer_ids[i]."""
        return self.aux_layer_ids + ((self.last_layer_id,) if self.last_layer_id is not None else ())


def _text_config(model_dir: Path) -> dict:
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"target.model: cannot read {model_dir}/config.json ({e})") from None
    return cfg.get("text_config") or cfg


def resolve_layer_plan(cfg: PipelineConfig) -> LayerPlan:
    """The explicit layer ids for this target, validated against its layer count (ConfigError names
    the field and the fix). Runs before anything starts."""
    text = _text_config(cfg.target.model)
    layers = num_hidden_layers(cfg.target.model)
    hidden = int(text.get("hidden_size") or 0)
    if layers <= 0 or hidden <= 0:
        raise ConfigError(f"target.model: {cfg.target.model}/config.json lacks num_hidden_layers/hidden_size "
                          "(or text_config.*); it must describe a decoder-only LM")
    ids = cfg.extract.aux_layer_ids
    source = "config"
    if ids is None:
        ids, source = default_aux_layer_ids(layers), "default"
    bad = [i for i in ids if not 0 <= i < layers]
    dup = len(set(ids)) != len(ids)
    if bad or dup:
        what = f"{bad} out of range (valid: 0..{layers - 1})" if bad else "not distinct"
        if source == "default":
            raise ConfigError(f"extract.aux_layer_ids: the default (2, L//2, L-3) = {ids} is {what} for a "
                              f"{layers}-layer target; set extract.aux_layer_ids explicitly, e.g. "
                              f"{[max(0, layers - 3), max(0, layers - 2), layers - 1] if layers >= 3 else [0]}")
        raise ConfigError(f"extract.aux_layer_ids: {ids} is {what} for a {layers}-layer target "
                          "(the last layer is added by extract.include_last_layer; do not list it)")
    last = layers if cfg.extract.include_last_layer else None
    return LayerPlan(layers, hidden, tuple(ids), last, source)


def extraction_dtype(cfg: PipelineConfig) -> str:
    """The dtype the extraction server runs the target in, hence the dtype of the saved hidden
    states: extract.hidden_states_dtype, else target.dtype, else the model's own config dtype."""
    for value in (cfg.extract.hidden_states_dtype, cfg.target.dtype):
        if value != "auto":
            return value
    text = _text_config(cfg.target.model)
    found = str(text.get("dtype") or text.get("torch_dtype") or "bfloat16")
    return found if found in DTYPE_BYTES else "bfloat16"


# ---- the manifest ----------------------------------------------------------------------------------

class ManifestError(PipelineError):
    """The extraction manifest is missing, unreadable or does not match the current config."""


@dataclass(frozen=True)
class ExtractManifest:
    layer_ids: list[int]               # every extracted id, in the files' order (hidden_states[:, i])
    aux_layer_ids: list[int]           # pass to training as --target-layer-ids (never the last layer)
    last_layer_id: int | None          # == num_hidden_layers when include_last_layer
    include_last_layer: bool
    layer_id_convention: str           # "vllm" (see CONVENTION_NOTE)
    convention_note: str
    layer_ids_source: str              # "config" or "default"
    num_hidden_layers: int
    hidden_size: int
    dtype: str                         # dtype of hidden_states in the files (torch name)
    num_samples: int                   # hs_0 .. hs_{n-1}, one per prepared row
    total_tokens: int
    total_bytes: int
    seq_length: int
    prepared_data: str                 # speculators prepare-data output (training's --data-path)
    token_freq: str | None             # prepared_data/token_freq.pt (for a reduced draft vocab)
    hidden_states_dir: str             # training's --hidden-states-path
    file_pattern: str
    target_model: str
    served_name: str
    source_samples: str                # the phase-1 file the prepared data was rendered from
    source_sha256: str
    settings_fingerprint: str
    created_at: float
    schema: int = MANIFEST_SCHEMA
    extra: dict = field(default_factory=dict)
    # "offline": every sample's file is in hidden_states_dir. "online": none is; the train phase
    # runs the extraction server beside the trainer, which writes each into hidden_states_dir (the
    # on-demand cache) and deletes it once loaded. Layer ids are recorded the same way in both.
    mode: str = "offline"
    decision: dict = field(default_factory=dict)  # eagle3.phases.hs_mode.Decision: estimate, free disk, why

    @property
    def target_layer_ids(self) -> list[int]:
        """speculators train --target-layer-ids: the aux ids without the last layer."""
        return list(self.aux_layer_ids)

    def to_dict(self) -> dict:
        return asdict(self)


def manifest_path(cfg: PipelineConfig) -> Path:
    return cfg.phase_dir(PHASE) / EXTRACT_MANIFEST


def write_manifest(cfg: PipelineConfig, manifest: ExtractManifest) -> Path:
    path = manifest_path(cfg)
    atomic_write_json(path, manifest.to_dict())
    return path


def read_extract_manifest(cfg: PipelineConfig, check_config: bool = True) -> ExtractManifest:
    """The layers (and data paths) phase 2 actually extracted. With `check_config`, also proves the
    current config still resolves to the same layers, so a later phase cannot silently train or
    serve with other ids than the hidden states hold."""
    path = manifest_path(cfg)
    try:
        raw = read_json(path)
    except (ValueError, OSError) as e:  # damaged on disk: name the file, never a bare decoder error
        raise ManifestError(f"{path}: unreadable extraction manifest ({e}); redo the extract phase "
                            "(`eagle3 run --from extract --force extract`)") from None
    if raw is not None and not isinstance(raw, dict):
        raise ManifestError(f"{path}: malformed manifest (a JSON {type(raw).__name__}, not an object); "
                            "redo the extract phase")
    if raw is None:
        raise ManifestError(f"{path}: no extraction manifest; run the extract phase first "
                            "(`eagle3 extract CONFIG` or `eagle3 run --from extract`)")
    if raw.get("schema") != MANIFEST_SCHEMA:
        raise ManifestError(f"{path}: manifest schema {raw.get('schema')!r}, this pack reads {MANIFEST_SCHEMA}; "
                            "rerun the extract phase")
    try:
        manifest = ExtractManifest(**raw)
    except TypeError as e:
        raise ManifestError(f"{path}: malformed manifest ({e}); rerun the extract phase") from None
    if manifest.layer_id_convention != CONVENTION:
        raise ManifestError(f"{path}: layer ids are in convention {manifest.layer_id_convention!r}, "
                            f"this pack uses {CONVENTION!r}")
    if check_config:
        plan = resolve_layer_plan(cfg)
        if list(plan.layer_ids) != manifest.layer_ids:
            raise ManifestError(f"{path}: the hidden states hold layers {manifest.layer_ids}, but the config now "
                                f"resolves extract.aux_layer_ids/include_last_layer to {list(plan.layer_ids)}; "
                                "restore the config or redo extraction (`eagle3 run --from extract --force extract`)")
    return manifest
