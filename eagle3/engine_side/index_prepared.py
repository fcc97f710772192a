"""Summarise a `speculators prepare-data` output for the pack: per sample, its length and a hash of its
token ids, so the pack (no pyarrow/datasets in its venv) can check hs_{i}.safetensors files in pure
Python: the file of sample i must hold seq_len[i] positions whose token_ids hash to ids_sha256[i].

Runs with the ENGINE interpreter (needs `datasets`):
    python index_prepared.py --data PREPARED_DIR --out INDEX.json
Hash: sha256 over the ids as little-endian int64 (the layout of token_ids in the hs files), first
16 hex digits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path


def ids_digest(ids: list[int]) -> str:
    return hashlib.sha256(struct.pack(f"<{len(ids)}q", *ids)).hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()

    from datasets import load_from_disk

    ds = load_from_disk(str(args.data)).select_columns(["input_ids"])
    seq_len, digests = [], []
    for row in ds.iter(batch_size=1024):
        for ids in row["input_ids"]:
            seq_len.append(len(ids))
            digests.append(ids_digest(list(ids)))
    index = {"num_samples": len(seq_len), "total_tokens": sum(seq_len), "seq_len": seq_len, "ids_sha256": digests,
             "hash": "sha256(int64 little-endian ids)[:16]"}
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=f".{args.out.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(index, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, args.out)
    print(f"indexed {len(seq_len)} samples, {sum(seq_len)} tokens -> {args.out}")


if __name__ == "__main__":
    main()
