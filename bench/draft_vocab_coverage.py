"""How much of the target's own answers a drafter can propose at all: the share of the tokens the
baseline generated on held-out prompts that lie inside the drafter's draft vocabulary (its `t2d` mask).
A draft token outside it is never proposed, so that share bounds the first position's acceptance from
above, and the draft vocabulary (`train.draft_vocab_size`) is a lever only when it is well below 1.

Reads a benchmark run's baseline answers (bench/clients/baseline-c*.json, `vllm bench serve`'s
generated_texts) and tokenizes them with the target's tokenizer, so it runs in the engine's environment
(transformers, safetensors):

    .venv-engine/bin/python bench/draft_vocab_coverage.py --run-dir runs/smollm2-cpu-drafter-acceptance \\
        --drafter runs/carried-drafter --out bench/results/draft-vocab-coverage-cpu-DATE.json
    .venv-engine/bin/python bench/draft_vocab_coverage.py --smoke --drafter DIR   # CI: held-out prompts' own
                                                                                  # text; not a measurement
With --samples (phase 1's samples.jsonl) and --train-manifest: the target's own answers to the drafter's
validation prompts (data.validation_ids: never trained on; the pack's own client keeps no answer text)
instead of a benchmark's. prepare-data counted those answers in token_freq.pt too, so --sizes' shares for
them are a little high near the least frequent tokens.
With --token-freq (prepare-data's token_freq.pt: each token's count over the training answers) and --sizes,
the same share for the draft vocabulary each size would have given: speculators keeps the most frequent
tokens of the training answers, so a size beyond the number of distinct tokens there buys nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def answers(run_dir: Path) -> tuple[list[str], Path]:
    """The baseline's answers of the run's first window, and the target model dir."""
    results = json.loads((run_dir / "bench" / "results.json").read_text())
    client = sorted((run_dir / "bench" / "clients").glob("baseline*-c*.json"))[0]
    return json.loads(client.read_text())["generated_texts"], Path(results["target"]["model"])


def main() -> int:
    from safetensors import safe_open
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", type=Path, default=REPO / "runs" / "smollm2-cpu-drafter-acceptance")
    ap.add_argument("--drafter", type=Path, required=True)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--smoke", action="store_true", help="the held-out prompts' own text (CI): not a measurement")
    ap.add_argument("--samples", type=Path, help="phase 1's samples.jsonl (with --train-manifest)")
    ap.add_argument("--train-manifest", type=Path, help="its data.validation_ids name the answers to read")
    ap.add_argument("--token-freq", type=Path, help="prepare-data's token_freq.pt, for --sizes")
    ap.add_argument("--sizes", default="8192,16384,32768,65536", help="draft vocabulary sizes (with --token-freq)")
    args = ap.parse_args()
    if args.smoke:
        rows = (REPO / "configs" / "prompts" / "generated" / "heldout.jsonl").read_text().splitlines()[:4]
        texts = [json.loads(r)["conversations"][-1]["content"] for r in rows]
        target = REPO / "models" / "smollm2-135m"
    elif args.samples:
        manifest = json.loads(args.train_manifest.read_text())
        held = set(manifest["data"]["validation_ids"] or ())
        rows = [json.loads(line) for line in args.samples.read_text().splitlines() if line.strip()]
        texts = [r["conversations"][-1]["content"] for r in rows if r["id"] in held]
        target = Path(manifest["target_model"])
    else:
        texts, target = answers(args.run_dir)
    tok = AutoTokenizer.from_pretrained(str(target))
    with safe_open(str(args.drafter / "model.safetensors"), "pt") as f:
        t2d = f.get_tensor("t2d").bool()
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    flat = [i for seq in ids for i in seq]
    outside = collections.Counter(i for i in flat if not t2d[i])
    share = 1 - sum(outside.values()) / len(flat)
    per_answer = sorted(1 - sum(not t2d[i] for i in seq) / len(seq) for seq in ids if seq)
    print(f"{len(texts)} answers, {len(flat)} tokens; inside the draft vocabulary ({int(t2d.sum())} of "
          f"{len(t2d)} tokens): {share:.2%}; per answer {per_answer[0]:.1%} to {per_answer[-1]:.1%}")
    top = [(tok.decode([i]), n) for i, n in outside.most_common(10)]
    print("most frequent outside: " + ", ".join(f"{t!r} x{n}" for t, n in top))
    by_size = {}
    if args.token_freq:
        import torch

        ranked = [t for t, _ in sorted(torch.load(str(args.token_freq), weights_only=True).items(),
                                       key=lambda kv: (-kv[1], kv[0]))]
        for size in (int(x) for x in args.sizes.split(",")):
            kept = set(ranked[:size])
            by_size[size] = sum(i in kept for i in flat) / len(flat)
            print(f"draft vocabulary {size} (of the {len(ranked)} distinct tokens the training answers hold): "
                  f"{by_size[size]:.2%} of the answers' tokens inside")
    if args.out:
        args.out.write_text(json.dumps({"inside_share_by_size": by_size, "distinct_training_tokens":
                                        len(ranked) if args.token_freq else None,
            "run_dir": str(args.run_dir), "drafter": str(args.drafter), "target": str(target),
            "answers": len(texts), "tokens": len(flat), "draft_vocab": int(t2d.sum()), "target_vocab": len(t2d),
            "inside_share": share, "per_answer_inside_share": per_answer,
            "outside_most_common": [[t, n] for t, n in top]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
