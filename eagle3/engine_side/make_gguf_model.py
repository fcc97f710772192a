"""Turn a GGUF checkpoint into a Hugging Face model dir that vLLM, SGLang and speculators load.

Runs with the ENGINE interpreter (torch, transformers, safetensors, and the `gguf` package that
transformers' GGUF reader needs); the pack calls it through eagle3.realmodel, which verifies the
source file before and the written dir after. What transformers derives from a GGUF is not trusted
where it was seen to vary between releases (docs/FACTS.md, "A real target from a GGUF"):
  - the tokenizer: transformers 5.17 and 5.19 convert the GGUF's vocabulary into different
    tokenizer.json files (5.17 adds byte fallback and a sentencepiece decoder), both without the
    per-digit split of llama.cpp's `smollm` pre-tokenizer, and 5.17 names <|im_start|> as EOS. The
    pack writes tokenizer.json and tokenizer_config.json itself, from the GGUF's own fields
    (tokens, merges, token types, tokenizer.ggml.*_token_id, tokenizer.ggml.pre, the chat template);
  - config.json: its `architectures` is missing and its `transformers_version` differs between
    releases; the pack writes the config from an allow-list, sorted, so its bytes depend on the GGUF.
The weights are dequantised by gguf's numpy code and cast to the requested dtype, then written with
sorted keys and fixed metadata: the same GGUF gives the same bytes on every machine, every file.

Prints one JSON line: what was written and what a reload of the written dir says (special tokens,
architecture, a greedy answer to --probe).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from gguf import GGUFReader  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

# The config keys each architecture's serving engines read, by the GGUF's model type; everything else
# transformers adds (GGUF provenance, quantization_config, its own version, defaults it derives such as
# Qwen2's layer_types) is left out on purpose, so the bytes depend on the GGUF alone. The next
# architecture is one row.
CONFIG_KEYS = {
    "llama": ("attention_bias", "attention_dropout", "head_dim", "hidden_act", "hidden_size", "initializer_range",
              "intermediate_size", "max_position_embeddings", "mlp_bias", "model_type", "num_attention_heads",
              "num_hidden_layers", "num_key_value_heads", "pretraining_tp", "rms_norm_eps", "rope_scaling",
              "rope_theta", "tie_word_embeddings", "vocab_size"),
    # Qwen2 has no attention_bias key: its q/k/v projections always carry a bias.
    "qwen2": ("attention_dropout", "hidden_act", "hidden_size", "initializer_range", "intermediate_size",
              "max_position_embeddings", "max_window_layers", "model_type", "num_attention_heads",
              "num_hidden_layers", "num_key_value_heads", "rms_norm_eps", "rope_scaling", "rope_theta",
              "sliding_window", "tie_word_embeddings", "use_sliding_window", "vocab_size"),
}


CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types: special tokens, and added tokens that are plain text
# llama.cpp's pre-tokenizer names -> the Hugging Face normalizer, pre-tokenizer, post-processor and decoder
# that split and join text the same way. The next pre-tokenizer is one row.
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
GPT2_ENDS = {"post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
             "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}}
# Qwen2's split: contractions, letters, every digit alone, punctuation runs, newlines; bytes after it.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_BYTES = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
TOKENIZER_STYLES = {
    "gpt2": {"normalizer": None, "pre_tokenizer": BYTE_LEVEL, **GPT2_ENDS},
    "smollm": {"normalizer": None, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]}, **GPT2_ENDS},
    "qwen2": {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False}, QWEN2_BYTES]},
              "post_processor": QWEN2_BYTES, "decoder": QWEN2_BYTES},
}


def gguf_fields(path: Path) -> dict:
    fields = GGUFReader(str(path)).fields
    return {name: field.contents() for name, field in fields.items()
            if name.startswith("tokenizer.") or name.endswith(".context_length")}


def special_ids(fields: dict) -> dict[str, int]:
    return {role: int(fields[f"tokenizer.ggml.{role}_token_id"]) for role in ("bos", "eos", "padding", "unknown")
            if f"tokenizer.ggml.{role}_token_id" in fields}


def write_tokenizer(fields: dict, out: Path, ids: dict[str, int]) -> None:
    """tokenizer.json and tokenizer_config.json from the GGUF's fields alone, as sorted JSON."""
    if fields.get("tokenizer.ggml.model") != "gpt2":
        raise SystemExit(f"tokenizer.ggml.model {fields.get('tokenizer.ggml.model')!r}: only byte-level BPE "
                         "(gpt2) GGUF vocabularies are supported")
    pre = fields.get("tokenizer.ggml.pre", "gpt2")
    if pre not in TOKENIZER_STYLES:
        raise SystemExit(f"tokenizer.ggml.pre {pre!r}: unknown pre-tokenizer (known: {sorted(TOKENIZER_STYLES)})")
    tokens, types = list(fields["tokenizer.ggml.tokens"]), list(fields["tokenizer.ggml.token_type"])
    merges = [m.split(" ", 1) for m in fields["tokenizer.ggml.merges"]]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": kind == CONTROL} for i, (t, kind) in enumerate(zip(tokens, types))
             if kind in (CONTROL, USER_DEFINED)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, **TOKENIZER_STYLES[pre],
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, sort_keys=True) + "\n")
    name = {role: tokens[i] for role, i in ids.items()}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": bool(fields.get("tokenizer.ggml.add_bos_token")),
              "add_eos_token": False, "clean_up_tokenization_spaces": False, "model_max_length": next(
                  (int(v) for k, v in fields.items() if k.endswith(".context_length")), 2048),
              "bos_token": name.get("bos"), "eos_token": name.get("eos"), "pad_token": name.get("padding", name.get("eos")),
              "unk_token": name.get("unknown")}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    template = fields.get("tokenizer.chat_template")
    if template:
        (out / "chat_template.jinja").write_text(template)


def rope_theta(cfg) -> float | None:
    # transformers 5 keeps rope_theta inside rope_parameters; 4.x had it at the top level.
    params = getattr(cfg, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(cfg, "rope_theta", None))


def write_config(model, out: Path, architecture: str, ids: dict[str, int], dtype: str) -> dict:
    full = model.config.to_dict()
    if full["model_type"] not in CONFIG_KEYS:
        raise SystemExit(f"model type {full['model_type']!r}: no config key list (known: {sorted(CONFIG_KEYS)})")
    config = {k: full[k] for k in CONFIG_KEYS[full["model_type"]] if k in full}
    config["rope_theta"] = rope_theta(model.config)
    config.update(architectures=[architecture], torch_dtype=dtype, bos_token_id=ids.get("bos"),
                  eos_token_id=ids.get("eos"), pad_token_id=ids.get("padding", ids.get("eos")))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {"bos_token_id": ids.get("bos"), "eos_token_id": ids.get("eos"),
                  "pad_token_id": ids.get("padding", ids.get("eos"))}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2, sort_keys=True) + "\n")
    return config


def write_weights(model, out: Path, dtype: torch.dtype) -> int:
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied: the engines rebuild it from embed_tokens
    tensors = {k: state[k].detach().to(dtype).contiguous() for k in sorted(state)}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def probe(out: Path, prompt: str, max_new_tokens: int) -> dict:
    """Reload the written dir the way a user would and answer one chat prompt greedily."""
    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    model.eval()
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=model.config.eos_token_id, pad_token_id=model.config.pad_token_id)
    new = gen[0, ids["input_ids"].shape[1]:].tolist()
    return {"digits_split": tok.tokenize("2024") == ["2", "0", "2", "4"], "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id, "bos_token": tok.bos_token,
            "config_eos_token_id": model.config.eos_token_id, "architectures": model.config.architectures,
            "answer": tok.decode(new, skip_special_tokens=True), "answer_token_ids": new}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--architecture", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--probe", required=True, help="A chat prompt answered greedily from the written dir.")
    ap.add_argument("--probe-tokens", type=int, default=32)
    args = ap.parse_args()
    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    fields = gguf_fields(args.gguf)
    ids = special_ids(fields)
    write_tokenizer(fields, args.out, ids)
    model = AutoModelForCausalLM.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name,
                                                 dtype=torch.float32)
    params = write_weights(model, args.out, getattr(torch, args.dtype))
    write_config(model, args.out, args.architecture, ids, args.dtype)
    del model
    report = {"gguf_special_ids": ids, "gguf_pre_tokenizer": fields.get("tokenizer.ggml.pre"), "parameters": params, "transformers": transformers.__version__,
              "torch": torch.__version__, **probe(args.out, args.probe, args.probe_tokens)}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
