"""What each training epoch bought: per epoch, the trainer's per-position validation accuracy and the
acceptance length it predicts at k (1 + the first k accuracies, the serve-parity gate's expectation), read
from a train log (`train/logs/train.log` of a run, or of a record's `run-files.tar.gz`).

    .venv/bin/python bench/epoch_lever.py TRAIN_LOG [--k 3] [--json OUT]

Validation accuracy is teacher-forced on held-back samples drawn like the training data: what a longer
training buys there is an upper bound on what it buys served on prompts of other kinds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3.bench.gates import expected_length  # noqa: E402
from eagle3.phases.train_log import validation_by_epoch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", type=Path)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    epochs = validation_by_epoch(args.log)
    if not epochs:
        sys.exit(f"{args.log}: no validation accuracy logged (a dry run, or not a speculators train log)")
    rows, before = [], None
    for n, acc in enumerate(epochs, 1):
        length = expected_length(acc, args.k)
        rows.append({"epoch": n, "full_acc": acc, "expected_length": round(length, 3),
                     "gain": None if before is None else round(length - before, 3)})
        print(f"epoch {n}: per position {'/'.join(f'{a:.3f}' for a in acc)}, expected length at k={args.k} "
              f"{length:.3f}" + ("" if before is None else f" ({length - before:+.3f})"))
        before = length
    if args.json:
        args.json.write_text(json.dumps({"log": str(args.log), "k": args.k, "epochs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
