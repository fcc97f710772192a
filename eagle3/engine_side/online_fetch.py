"""Engine-side (speculators' interpreter): fetch hidden states on demand through speculators' own
training data path, exactly as `speculators train --on-missing generate` does, without training.

The online train phase runs this on a CPU rehearsal, where the trainer can only `--dry-run` (which
exits before it builds its data loaders): every sample goes through speculators' ArrowDataset with
on_missing="generate" and its FileTransfer, i.e. a completion request to the extraction server,
the server's file under the cache dir, speculators' load + check_hidden_states, and its delete.
The record (per sample: tokens, the file's bytes as the server wrote it) lets the pack check its
size estimate against real files.

    python online_fetch.py --data PREPARED --cache DIR --endpoint URL/v1 --model NAME --out REPORT.json
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-len", type=int, default=8192)
    args = ap.parse_args()

    from hs_connectors import FileTransfer
    from speculators.train.data import ArrowDataset

    sizes: dict[str, int] = {}

    class RecordingTransfer(FileTransfer):
        """speculators' FileTransfer; records each generated file's size before it is loaded."""

        def get_generated(self, params):
            handle = params.get("hidden_states_path") or params.get("handle")
            try:  # the server holds the lock exclusively until the file is complete
                with open(handle + ".lock") as lf:
                    fcntl.flock(lf, fcntl.LOCK_SH)
            except FileNotFoundError:
                pass
            sizes[handle] = os.path.getsize(handle) if os.path.exists(handle) else -1
            return super().get_generated(params)

    dataset = ArrowDataset(max_len=args.max_len, datapath=args.data, transfer=RecordingTransfer(Path(args.cache)),
                           vllm_endpoint=args.endpoint, on_missing="generate", model=args.model)
    samples, t0 = [], time.monotonic()
    for i in range(len(dataset)):
        before = set(sizes)
        item = dataset[i]
        if not isinstance(item, dict):
            raise SystemExit(f"sample {i}: unavailable ({getattr(item, 'reason', item)})")
        handle = (set(sizes) - before).pop()
        samples.append({"index": i, "tokens": int(item["input_ids"].shape[0]),
                        "hidden_states_shape": list(item["hidden_states"].shape),
                        "verifier_last_shape": list(item["verifier_last_hidden_states"].shape),
                        "file_bytes": sizes[handle], "file_deleted": not os.path.exists(handle)})
        print(f"online-fetch: sample {i + 1}/{len(dataset)}: {samples[-1]['tokens']} tokens, "
              f"{sizes[handle]} bytes", flush=True)
    report = {"samples": samples, "seconds": round(time.monotonic() - t0, 3),
              "samples_per_s": round(len(samples) / max(time.monotonic() - t0, 1e-9), 3)}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(report, fh)
    os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
