"""What each serving engine's EAGLE-3 loader reads from a drafter checkpoint (config fields, weight
names and shapes), and the two aux-layer id conventions (docs/FACTS.md §2).

Two checkpoint layouts exist:
  speculators  `speculators_model_type: eagle3`, decoder fields nested in `transformer_layer_config`,
               aux ids top-level, weights `layers.0.*`, optional `input_norm` (norm_before_fc).
  eagle        `architectures: ["LlamaForCausalLMEagle3"]`, Llama fields top-level, aux ids in
               `eagle_config`, weights `midlayer.*` (EAGLE reference / SpecForge / SGLang).

Aux-layer ids: in the "vllm" convention (EAGLE reference, vLLM, speculators; the extraction
manifest's) id k is the input of decoder layer k; in the "sglang" convention (SGLang, SpecForge
configs) id k is the output of layer k, so sglang id = vllm id - 1. vLLM reads a config's ids as
they are; SGLang adds 1 to whatever its config holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import engine_registry

# The names below are stored in records (manifests, reports) and so keep the engines' names they were given;
# each is defined here once and the code refers to it, never to an engine's name.
LAYER_INPUT = "vllm"    # id k = input of decoder layer k (= eagle3.phases.extract_manifest.CONVENTION)
LAYER_OUTPUT = "sglang"  # id k = output of decoder layer k
CONVENTIONS = (LAYER_INPUT, LAYER_OUTPUT)
# The drafter layouts the engines' loaders read (named for the loader that defines each) and how each
# means its aux ids; an engine names its own (Engine.drafter_layout), so a new engine whose loader reads
# one of these adds nothing here.
SPECULATORS_LAYOUT = "vllm"  # speculators' checkpoint, as vLLM's loader reads it
EAGLE_LAYOUT = "sglang"      # an EAGLE checkpoint with Llama fields at the top level, as SGLang's loader reads it
LAYOUT_CONVENTION = {SPECULATORS_LAYOUT: LAYER_INPUT, EAGLE_LAYOUT: LAYER_OUTPUT}
# Written by the train phase beside the checkpoint it serves: what the drafter learned from (phase 1's
# sampling, sample and token counts) and how it was trained. Engines ignore it; the checksum leaves it out.
PROVENANCE = "eagle3-provenance.json"

SPECULATORS_ARCHS = ("Eagle3DraftModel", "Eagle3Speculator")
EAGLE_ARCHS = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM")
SGLANG_ARCH = "LlamaForCausalLMEagle3"


def to_layer_input(ids: list[int], convention: str) -> list[int]:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown aux-layer id convention {convention!r}; use one of {CONVENTIONS}")
    return list(ids) if convention == LAYER_INPUT else [i + 1 for i in ids]


def from_layer_input(ids: list[int], convention: str) -> list[int]:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown aux-layer id convention {convention!r}; use one of {CONVENTIONS}")
    return list(ids) if convention == LAYER_INPUT else [i - 1 for i in ids]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: where (a config field or a weight name) and what to do."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@dataclass
class DrafterConfig:
    """The fields of a drafter's config.json that decide what its weights must look like."""

    layout: str  # "speculators" | "eagle"
    architectures: list[str]
    model_type: str
    hidden_size: int
    target_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int | None
    num_layers: int
    aux_ids: list[int] | None          # as stored in the file
    aux_ids_field: str                 # where they are stored
    num_aux_vllm: int                  # how many aux states vLLM sizes `fc` for
    norm_before_fc: bool
    norm_before_residual: bool
    norm_output: bool
    fc_norm: bool
    tie_word_embeddings: bool
    attention_bias: bool
    raw: dict = field(repr=False, default_factory=dict)


def _int(d: dict, key: str, where: str, problems: list[Problem], default: Any = None) -> int | None:
    value = d.get(key, default)
    if value is None:
        problems.append(Problem(where + key, "missing; the engine cannot size the drafter without it "
                                             "(re-export the checkpoint from the trainer)"))
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        problems.append(Problem(where + key, f"must be a positive integer, got {value!r}"))
        return None
    return value


def parse_config(raw: dict) -> tuple[DrafterConfig | None, list[Problem]]:
    """Read either layout; return the parsed config or the list of fields that are missing/bad."""
    problems: list[Problem] = []
    if raw.get("speculators_model_type") is not None:
        if raw["speculators_model_type"] != "eagle3":
            return None, [Problem("speculators_model_type", f"is {raw['speculators_model_type']!r}; this gate "
                                  "checks EAGLE-3 drafters only (train with --speculator-type eagle3)")]
        layout = "speculators"
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            return None, [Problem("transformer_layer_config", "missing; a speculators checkpoint nests the decoder "
                                  "config there (re-save the checkpoint with speculators)")]
        where = "transformer_layer_config."
        aux_ids, aux_field = raw.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids"
        eagle_cfg = raw.get("eagle_config") or {}
        # vLLM defaults for a speculators config (vllm/transformers_utils/configs/speculators/algos.py)
        nbr = raw.get("norm_before_residual", True)
        nbf = raw.get("norm_before_fc", False)
        nout = raw.get("norm_output", False)
    else:
        layout = "eagle"
        layer, where = raw, ""
        eagle_cfg = raw.get("eagle_config") or {}
        aux_ids, aux_field = raw.get("eagle_aux_hidden_state_layer_ids"), "eagle_aux_hidden_state_layer_ids"
        if not aux_ids:
            aux_ids, aux_field = eagle_cfg.get("eagle_aux_hidden_state_layer_ids"), \
                "eagle_config.eagle_aux_hidden_state_layer_ids"
        nbr = raw.get("norm_before_residual", False)
        nbf = eagle_cfg.get("norm_before_fc", raw.get("norm_before_fc", False))
        nout = raw.get("norm_output", False)
    archs = raw.get("architectures") or []
    hidden = _int(layer, "hidden_size", where, problems)
    heads = _int(layer, "num_attention_heads", where, problems)
    kv = _int(layer, "num_key_value_heads", where, problems, default=layer.get("num_attention_heads"))
    inter = _int(layer, "intermediate_size", where, problems)
    vocab = _int(layer, "vocab_size", where, problems)
    nlayers = _int(layer, "num_hidden_layers", where, problems, default=1)
    head_dim = layer.get("head_dim") or (hidden // heads if hidden and heads else None)
    draft_vocab = raw.get("draft_vocab_size")
    if draft_vocab is not None and (not isinstance(draft_vocab, int) or draft_vocab <= 0):
        problems.append(Problem("draft_vocab_size", f"must be a positive integer, got {draft_vocab!r}"))
        draft_vocab = None
    target_hidden = raw.get("target_hidden_size") or hidden
    if aux_ids is not None and (not isinstance(aux_ids, list) or not all(isinstance(i, int) for i in aux_ids)):
        problems.append(Problem(aux_field, f"must be a list of layer ids, got {aux_ids!r}"))
        aux_ids = None
    num_aux_vllm = raw.get("num_aux_hidden_states") or len(eagle_cfg.get("eagle_aux_hidden_state_layer_ids") or []) or 3
    if problems:
        return None, problems
    return DrafterConfig(
        layout=layout, architectures=list(archs), model_type=str(layer.get("model_type", "llama")),
        hidden_size=hidden, target_hidden_size=target_hidden, num_heads=heads, num_kv_heads=kv,
        head_dim=int(head_dim), intermediate_size=inter, vocab_size=vocab, draft_vocab_size=draft_vocab,
        num_layers=nlayers, aux_ids=aux_ids, aux_ids_field=aux_field, num_aux_vllm=int(num_aux_vllm),
        norm_before_fc=bool(nbf), norm_before_residual=bool(nbr), norm_output=bool(nout),
        fc_norm=bool(raw.get("fc_norm", False)), tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(layer.get("attention_bias", False)), raw=raw,
    ), []


# ---- expected weights --------------------------------------------------------------------------

@dataclass
class Expected:
    required: dict[str, tuple[int, ...]]
    optional: dict[str, tuple[int, ...]]
    # names an engine accepts as another name (alias -> canonical)
    aliases: dict[str, str] = field(default_factory=dict)


def _layer_weights(c: DrafterConfig, prefix: str, first: bool, qk_norm: bool, input_layernorm: bool
                   ) -> dict[str, tuple[int, ...]]:
    h, q_out, kv_out = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    qkv_in = 2 * h if first else h
    w = {
        f"{prefix}self_attn.q_proj.weight": (q_out, qkv_in),
        f"{prefix}self_attn.k_proj.weight": (kv_out, qkv_in),
        f"{prefix}self_attn.v_proj.weight": (kv_out, qkv_in),
        f"{prefix}self_attn.o_proj.weight": (h, q_out),
        f"{prefix}mlp.gate_proj.weight": (c.intermediate_size, h),
        f"{prefix}mlp.up_proj.weight": (c.intermediate_size, h),
        f"{prefix}mlp.down_proj.weight": (h, c.intermediate_size),
        f"{prefix}hidden_norm.weight": (h,),
        f"{prefix}post_attention_layernorm.weight": (h,),
    }
    if input_layernorm:
        w[f"{prefix}input_layernorm.weight"] = (h,)
    if c.attention_bias:
        for p, n in (("q", q_out), ("k", kv_out), ("v", kv_out)):
            w[f"{prefix}self_attn.{p}_proj.bias"] = (n,)
    if qk_norm:
        w[f"{prefix}self_attn.q_norm.weight"] = (c.head_dim,)
        w[f"{prefix}self_attn.k_norm.weight"] = (c.head_dim,)
    return w


def _head_weights(c: DrafterConfig, num_aux: int) -> tuple[dict, dict]:
    draft_vocab = c.draft_vocab_size or c.vocab_size
    required = {"fc.weight": (c.hidden_size, num_aux * c.target_hidden_size), "norm.weight": (c.hidden_size,)}
    optional = {"embed_tokens.weight": (c.vocab_size, c.hidden_size), "t2d": (c.vocab_size,)}
    if not c.tie_word_embeddings:
        required["lm_head.weight"] = (draft_vocab, c.hidden_size)
    if draft_vocab != c.vocab_size:
        required["d2t"] = (draft_vocab,)  # without it draft ids are read as target ids (AL ~1.1)
    else:
        optional["d2t"] = (draft_vocab,)
    return required, optional


def expected_vllm(c: DrafterConfig) -> Expected:
    """vLLM `Eagle3LlamaForCausalLM` / `Eagle3Qwen3ForCausalLM`: unknown names fail the load."""
    required, optional = _head_weights(c, c.num_aux_vllm)
    for i in range(c.num_layers):
        required.update(_layer_weights(c, f"layers.{i}.", first=i == 0, qk_norm=c.model_type == "qwen3",
                                       input_layernorm=True))
    if c.norm_before_fc:
        required["input_norm.weight"] = (c.num_aux_vllm * c.target_hidden_size,)
    if c.fc_norm:
        for i in range(c.num_aux_vllm):
            required[f"fc_norm.{i}.weight"] = (c.target_hidden_size,)
    aliases = {k.replace("layers.0.", "midlayer.", 1): k for k in required if k.startswith("layers.0.")}
    return Expected(required, optional, aliases)


def expected_sglang(c: DrafterConfig) -> Expected:
    """SGLang `LlamaForCausalLMEagle3` (llama_eagle3.py before PR 24663): tries `name`, then
    `model.{name}`; anything else is dropped without a word. `fc` is sized for exactly 3 aux states;
    layer 0 is `midlayer`, layers >= 1 `additional_layers.{i-1}` (no input_layernorm there)."""
    required, optional = _head_weights(c, 3)
    required.update(_layer_weights(c, "midlayer.", first=True, qk_norm=False, input_layernorm=True))
    for i in range(1, c.num_layers):
        required.update(_layer_weights(c, f"additional_layers.{i - 1}.", first=False, qk_norm=False,
                                       input_layernorm=False))
    return Expected(required, optional, {})


EXPECTED = {SPECULATORS_LAYOUT: expected_vllm, EAGLE_LAYOUT: expected_sglang}


# ---- engine-specific config rules --------------------------------------------------------------

def layout_of(engine: str) -> str:
    """The drafter layout `engine` loads (a key of LAYOUT_CONVENTION)."""
    return engine_registry.get(engine).drafter_layout


def config_problems(layout: str, c: DrafterConfig) -> list[Problem]:
    """Settings a loader of `layout` would reject or silently mis-serve."""
    out: list[Problem] = []
    if layout == SPECULATORS_LAYOUT:
        known = set(SPECULATORS_ARCHS) | set(EAGLE_ARCHS)
        if c.layout == "eagle" and not set(c.architectures) & known:
            out.append(Problem("architectures", f"{c.architectures} is not an EAGLE-3 drafter architecture vLLM "
                               f"knows ({sorted(known)}); set it to [\"LlamaForCausalLMEagle3\"]"))
        if c.model_type not in ("llama", "qwen3"):
            out.append(Problem("transformer_layer_config.model_type" if c.layout == "speculators" else "model_type",
                               f"{c.model_type!r}: vLLM has EAGLE-3 drafters for llama and qwen3 only; "
                               "train with --draft-arch llama"))
        if c.aux_ids and len(c.aux_ids) != c.num_aux_vllm:
            out.append(Problem(c.aux_ids_field, f"{len(c.aux_ids)} aux layers, but vLLM sizes `fc` for "
                               f"{c.num_aux_vllm} (from num_aux_hidden_states / eagle_config, default 3); "
                               "set eagle_config.eagle_aux_hidden_state_layer_ids to the same list"))
    elif layout == EAGLE_LAYOUT:
        if c.layout != "eagle" or SGLANG_ARCH not in c.architectures:
            out.append(Problem("architectures", f"{c.architectures or 'missing'} ({c.layout} layout): SGLang loads "
                               f"EAGLE-3 drafters as [\"{SGLANG_ARCH}\"] with Llama fields at the top level; "
                               "export the checkpoint: `eagle3 export-drafter DIR OUT --engine sglang`"))
        if c.model_type != "llama":
            out.append(Problem("model_type", f"{c.model_type!r}: SGLang's LlamaForCausalLMEagle3 is a llama drafter; "
                               "train with --draft-arch llama"))
        if c.aux_ids is not None and len(c.aux_ids) != 3:
            out.append(Problem(c.aux_ids_field, f"{len(c.aux_ids)} aux layers; SGLang's drafter takes exactly 3 "
                               "(fc input = 3 x hidden)"))
        retrain = ("SGLang's drafter has no such option, so it would mis-serve; retrain with "
                   "train.extra_args [--no-norm-before-fc, --no-norm-before-residual, --no-norm-output]")
        for flag, on in (("norm_before_fc", c.norm_before_fc), ("norm_before_residual", c.norm_before_residual),
                         ("norm_output", c.norm_output), ("fc_norm", c.fc_norm)):
            if on:
                out.append(Problem(flag, f"is true; {retrain}"))
    return out
