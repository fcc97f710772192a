"""Build a tiny, randomly initialised Llama model directory for CPU rehearsals.

Runs with the ENGINE interpreter (it needs torch, transformers, tokenizers, safetensors, which the
pack's own venv does not have); the pack calls it through eagle3.tinymodel. Every byte is a
function of the arguments and the corpus: the tokenizer is trained single-threaded on fixed text,
and the weights are drawn from one seeded generator in sorted key order instead of through
transformers' initialisers (whose order and defaults change between releases).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

# The BPE trainer counts words on a thread pool; one thread removes any doubt about tie order.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

# Llama-3's special tokens in Llama-3's order, appended after the BPE vocabulary (as Llama-3 does),
# so that id 0 is an ordinary byte token: the constant variant always emits id 0, and that must
# not be an end-of-turn token.
SPECIAL_TOKENS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>",
]
BOS, EOS, PAD, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|finetune_right_pad_id|>", "<|eot_id|>"

# Llama-3 shape: BOS once, one header block per message, <|eot_id|> closing each turn. It is
# prefix-stable at assistant-turn boundaries, which speculators' render-boundary loss masks need.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + (message['content'] | trim) + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def corpus_lines(paths: list[Path]) -> list[str]:
    """The shipped text, plus camel-cased compounds of its own words. The compounds are a
    deterministic way to give the trainer enough distinct pairs to fill a 4k vocabulary from a
    few kilobytes of prose (identifier-like tokens are also what chat replies about code contain)."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in paths)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    words = sorted({w.lower() for w in re.findall(r"[A-Za-z]{3,}", text)})
    n = len(words)
    for step in (1, 7, 31, 127):
        lines.append(" ".join(words[i] + words[(i * step + step) % n].capitalize() for i in range(n)))
    for i in range(0, 2048, 3):  # numbers as they appear in code and logs
        lines.append(f"{i} {i * 17 % 1000}.{i % 100:02d} port {8000 + i} id_{i:04d}")
    return lines


def train_tokenizer(lines: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(SPECIAL_TOKENS), min_frequency=1,
                                  show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer=trainer)
    learned = tok.get_vocab_size()
    if learned != vocab_size - len(SPECIAL_TOKENS):
        sys.exit(f"tokenizer: the corpus yielded {learned} tokens, need {vocab_size - len(SPECIAL_TOKENS)}; "
                 "add text to the corpus or lower --vocab")
    tok.add_special_tokens(SPECIAL_TOKENS)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, bos_id)])
    return tok


def llama_config(args, tok: Tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, max_position_embeddings=args.max_positions,
        rms_norm_eps=1e-5, initializer_range=0.02, tie_word_embeddings=False,
        bos_token_id=tok.token_to_id(BOS), eos_token_id=[tok.token_to_id(EOS), tok.token_to_id(EOT)],
        pad_token_id=tok.token_to_id(PAD), architectures=["LlamaForCausalLM"], dtype="float32",
    )


def random_weights(config, seed: int, constant: bool) -> dict[str, torch.Tensor]:
    from transformers import LlamaForCausalLM

    with torch.device("meta"):  # only the parameter names and shapes; no memory, no initialiser
        shapes = {k: tuple(v.shape) for k, v in LlamaForCausalLM(config).state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            weights[name] = torch.ones(shapes[name], dtype=torch.float32)
        else:
            weights[name] = torch.empty(shapes[name], dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
    if constant:
        # All logits become 0, so greedy decoding always emits id 0 (docs/FACTS.md §5): a drafter
        # that also always proposes id 0 is then accepted 100 % of the time.
        weights["model.norm.weight"].zero_()
    return weights


def save_tokenizer(tok: Tokenizer, out: Path, max_positions: int) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOT, pad_token=PAD,
                                   model_max_length=max_positions, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    # Older loaders read the template only from tokenizer_config.json; newer ones from the .jinja.
    # Write both so any engine version picks the same template up.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    cfg_path = out / "tokenizer_config.json"
    tok_cfg = json.loads(cfg_path.read_text())
    tok_cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(tok_cfg, indent=2, sort_keys=True) + "\n")


def self_check(out: Path, constant: bool) -> None:
    """Load what was written the way an engine would, and fail the build if it does not work."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    text = "Explain a binary search in two sentences."
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    rendered = tok.decode(ids)
    if not rendered.startswith(BOS) or text not in rendered or not rendered.endswith("<|end_header_id|>\n\n"):
        sys.exit(f"self-check: the chat template rendered unexpectedly: {rendered!r}")
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    if tuple(logits.shape) != (1, len(ids), model.config.vocab_size):
        sys.exit(f"self-check: logits have shape {tuple(logits.shape)}")
    if constant and int(logits[0, -1].argmax()) != 0:
        sys.exit("self-check: the constant variant does not predict id 0")
    if not constant and float(logits.std()) == 0.0:
        sys.exit("self-check: the model's logits are constant")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="empty or missing directory to write")
    ap.add_argument("--corpus", type=Path, action="append", required=True, help="tokenizer training text")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--max-positions", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--constant", action="store_true", help="zero model.norm.weight (greedy always emits id 0)")
    ap.add_argument("--no-self-check", dest="self_check", action="store_false")
    args = ap.parse_args()

    if args.out.exists() and any(args.out.iterdir()):
        sys.exit(f"--out {args.out} is not empty; give a new directory")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    tok = train_tokenizer(corpus_lines(args.corpus), args.vocab)
    config = llama_config(args, tok)
    config.save_pretrained(args.out)
    from transformers import GenerationConfig

    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(args.out)
    weights_path = args.out / "model.safetensors"
    save_file(random_weights(config, args.seed, args.constant), str(weights_path), metadata={"format": "pt"})
    weights_path.chmod(0o644)  # safetensors creates it 0600; engines may run as another user
    save_tokenizer(tok, args.out, args.max_positions)
    if args.self_check:
        self_check(args.out, args.constant)
    import tokenizers
    import transformers

    print(f"tiny model written to {args.out}: {args.layers} layers, hidden {args.hidden}, vocab "
          f"{config.vocab_size}, constant={args.constant} (torch {torch.__version__}, transformers "
          f"{transformers.__version__}, tokenizers {tokenizers.__version__})", flush=True)


if __name__ == "__main__":
    main()
