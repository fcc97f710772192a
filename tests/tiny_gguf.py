"""Write a tiny Qwen2 GGUF the way llama.cpp lays one out, for the converter's tests.

Runs with the engine interpreter (gguf, tokenizers, numpy): `python tests/tiny_gguf.py OUT.gguf`. The
file has what a real Qwen2.5 GGUF has and the SmolLM2 one lacks: the `qwen2` architecture and
pre-tokenizer, q/k/v biases, an output matrix of its own (untied from the embeddings), control tokens
(type 3) and plain-text added tokens (type 4, like Qwen's <tool_call>). Weights are float32 and random,
from a fixed seed, so the file is the same on every machine; it prints the tensor names it wrote.
"""

from __future__ import annotations

import json
import sys

import gguf
import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, CONTEXT = 8, 128, 256, 4, 2, 1024  # head_dim 32: vLLM's CPU attention has no 16
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEXT_TOKENS = ["<tool_call>", "</tool_call>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.",
          "for i in range(10):\n    print(i)\n", "Explain a hash map in two sentences.",
          "café naïve résumé", "SELECT name FROM users WHERE id = 42;"] * 20


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE learned on CORPUS (llama.cpp stores tokens, their types and the merges)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(CORPUS, trainer=trainers.BpeTrainer(
        vocab_size=400, min_frequency=1, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    tokens += CONTROL + TEXT_TOKENS
    types += [gguf.TokenType.CONTROL] * len(CONTROL) + [gguf.TokenType.USER_DEFINED] * len(TEXT_TOKENS)
    return tokens, [int(t) for t in types], merges


def main() -> int:
    out = sys.argv[1]
    tokens, types, merges = vocabulary()
    rng = np.random.default_rng(0)
    head_dim = HIDDEN // HEADS

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w = gguf.GGUFWriter(out, "qwen2")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    vocab = len(tokens)
    tensors = {"token_embd.weight": weight(vocab, HIDDEN), "output.weight": weight(vocab, HIDDEN),
               "output_norm.weight": np.ones(HIDDEN, np.float32)}
    for i in range(LAYERS):
        b = f"blk.{i}."
        tensors.update({
            b + "attn_norm.weight": np.ones(HIDDEN, np.float32), b + "ffn_norm.weight": np.ones(HIDDEN, np.float32),
            b + "attn_q.weight": weight(HIDDEN, HIDDEN), b + "attn_q.bias": weight(HIDDEN),
            b + "attn_k.weight": weight(KV_HEADS * head_dim, HIDDEN), b + "attn_k.bias": weight(KV_HEADS * head_dim),
            b + "attn_v.weight": weight(KV_HEADS * head_dim, HIDDEN), b + "attn_v.bias": weight(KV_HEADS * head_dim),
            b + "attn_output.weight": weight(HIDDEN, HIDDEN),
            b + "ffn_gate.weight": weight(FFN, HIDDEN), b + "ffn_up.weight": weight(FFN, HIDDEN),
            b + "ffn_down.weight": weight(HIDDEN, FFN)})
    for name, array in tensors.items():
        w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(json.dumps(sorted(tensors)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
