"""Write an EAGLE-format EAGLE-3 drafter for a target model, with random (untrained) weights.

Runs with the ENGINE interpreter (torch, safetensors); the pack calls it through
eagle3.drafters.testmaker. Layout (docs/FACTS.md §2): `architectures
["LlamaForCausalLMEagle3"]`, one decoder layer `midlayer.*` whose q/k/v take 2·H inputs,
`fc` [H, n_aux·H], `norm`, `lm_head` [draft_vocab, H], and `d2t`/`t2d` when the draft vocabulary
is smaller than the target's. No `embed_tokens`: vLLM shares the target's embedding.

--constant builds the drafter of the 100 %-acceptance check (docs/FACTS.md §5): the full target
vocabulary as draft vocabulary and `norm.weight` zeroed, so every draft logit is 0 and greedy
drafting always proposes token 0, which is what a constant target (its final norm zeroed) emits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file


def default_aux_ids(layers: int) -> list[int]:
    # vLLM's and speculators' default, in the layer-input convention.
    return [2, layers // 2, layers - 3]


def drafter_config(target: dict, aux_ids: list[int], draft_vocab: int) -> dict:
    hidden = target["hidden_size"]
    heads = target["num_attention_heads"]
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": target["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": target.get("num_key_value_heads", heads),
        "head_dim": target.get("head_dim") or hidden // heads,
        "hidden_act": "silu",
        "rms_norm_eps": target.get("rms_norm_eps", 1e-5),
        "max_position_embeddings": target.get("max_position_embeddings", 2048),
        "rope_parameters": target.get("rope_parameters", {"rope_theta": 10000.0, "rope_type": "default"}),
        "vocab_size": target["vocab_size"],
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": hidden,
        "tie_word_embeddings": False,
        "bos_token_id": target.get("bos_token_id"),
        "eos_token_id": target.get("eos_token_id"),
        "dtype": "float32",
        # Both places: vLLM reads the top-level field, SGLang/SpecForge the eagle_config one.
        # Convention: layer-input ids (vLLM/speculators), as docs/FACTS.md §2 records.
        "eagle_aux_hidden_state_layer_ids": list(aux_ids),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux_ids), "use_aux_hidden_state": True,
                         "aux_layer_id_convention": "layer-input"},
    }


def drafter_weights(cfg: dict, seed: int, constant: bool) -> dict[str, torch.Tensor]:
    h, f = cfg["hidden_size"], cfg["intermediate_size"]
    q_out = cfg["num_attention_heads"] * cfg["head_dim"]
    kv_out = cfg["num_key_value_heads"] * cfg["head_dim"]
    n_aux = len(cfg["eagle_aux_hidden_state_layer_ids"])
    vocab, draft_vocab = cfg["vocab_size"], cfg["draft_vocab_size"]
    shapes = {
        "midlayer.self_attn.q_proj.weight": (q_out, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv_out, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv_out, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q_out),
        "midlayer.mlp.gate_proj.weight": (f, h),
        "midlayer.mlp.up_proj.weight": (f, h),
        "midlayer.mlp.down_proj.weight": (h, f),
        "fc.weight": (h, n_aux * h),
        "lm_head.weight": (draft_vocab, h),
    }
    gen = torch.Generator().manual_seed(seed)
    weights = {name: torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
               for name, shape in sorted(shapes.items())}
    for name in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
                 "midlayer.post_attention_layernorm.weight", "norm.weight"):
        weights[name] = torch.ones(h, dtype=torch.float32)
    if constant:
        weights["norm.weight"].zero_()  # every draft logit 0 -> greedy drafting always proposes id 0
    if draft_vocab < vocab:
        # Draft id i maps to target id i + d2t[i] (an offset); the first ids stand in for the
        # "most frequent" tokens a trainer would pick. t2d marks the target ids kept.
        weights["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[:draft_vocab] = True
        weights["t2d"] = t2d
    return weights


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True, help="target model dir (its config.json sizes the drafter)")
    ap.add_argument("--out", type=Path, required=True, help="empty or missing directory to write")
    ap.add_argument("--aux-layer-ids", type=int, nargs="+", default=None,
                    help="layer-input convention; default [2, L//2, L-3]")
    ap.add_argument("--draft-vocab", type=int, default=None, help="default: 1/4 of the target vocab (full with --constant)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--constant", action="store_true", help="full draft vocab and zeroed norm: always drafts id 0")
    args = ap.parse_args()

    target = json.loads((args.target / "config.json").read_text())
    target = target.get("text_config") or target
    layers = target["num_hidden_layers"]
    aux = args.aux_layer_ids or default_aux_ids(layers)
    if len(set(aux)) != len(aux) or any(not 0 <= i < layers for i in aux):
        sys.exit(f"--aux-layer-ids {aux}: need distinct ids in 0..{layers - 1} for a {layers}-layer target")
    vocab = target["vocab_size"]
    draft_vocab = vocab if args.constant else (args.draft_vocab or max(1, vocab // 4))
    if args.constant and args.draft_vocab not in (None, vocab):
        sys.exit("--constant needs the full target vocabulary as draft vocabulary")
    if not 0 < draft_vocab <= vocab:
        sys.exit(f"--draft-vocab {draft_vocab}: must be in 1..{vocab}")
    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"--out {args.out} is not empty; give a new directory")
    args.out.mkdir(parents=True, exist_ok=True)

    cfg = drafter_config(target, aux, draft_vocab)
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    path = args.out / "model.safetensors"
    save_file(drafter_weights(cfg, args.seed, args.constant), str(path), metadata={"format": "pt"})
    path.chmod(0o644)  # safetensors creates it 0600; engines may run as another user
    print(f"EAGLE-3 drafter written to {args.out}: aux layers {aux}, draft vocab {draft_vocab}/{vocab}, "
          f"constant={args.constant} (torch {torch.__version__})", flush=True)


if __name__ == "__main__":
    main()
