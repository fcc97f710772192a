"""Summarise a `speculators prepare-data` output for the pack: per sample, its length and a hash of its
token ids, so the pack (no pyarrow/datasets in its venv) can check hs_{i}.safetensors files in pure
Python: the file of sample i must hold seq_len[i] positions whose token_ids hash to ids_sha256[i].

Runs with the ENGINE interpreter (needs `datasets`):
    python index_prepared.py --data PREPARED_DIR --out INDEX.json [--samples SAMPLES.jsonl]
Hash: sha256 over the ids as little-endian int64 (the layout of token_ids in the hs files), first
16 hex digits.

With --samples (phase 1's samples.jsonl): `sample_ids`, per prepared row the id of the sample it was
tokenised from, or null. prepare-data shuffles the rows and keeps no id, and the trainer validates on the
last rows of that order: this is how the pack knows which prompts its validation accuracy was measured on.
A row is matched by its prompt: it starts with the token ids the serving engine reported for that prompt
(meta.prompt_token_ids, rendered by the same server's chat template); a sample without them matches no row.
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


_B, _M = 1_000_003, (1 << 61) - 1  # a polynomial hash of token-id prefixes, updated one token at a time


def _extend(h: int, token: int) -> int:
    return (h * _B + token + 1) % _M


def prompt_ids_of(samples: Path) -> dict:
    """Each sample's prompt token ids, by (length, prefix hash) -> (its id, or None where two samples share
    that prompt; the ids themselves, to confirm a hash match)."""
    table: dict[tuple[int, int], tuple[str | None, tuple]] = {}
    with open(samples, encoding="utf-8") as fh:
        for line in fh:
            try:
                row = json.loads(line)
                ids = (row.get("meta") or {}).get("prompt_token_ids")
            except (ValueError, AttributeError):
                continue  # a torn last line: the producer's, never repaired here
            if ids and "id" in row:
                h = 0
                for t in ids:
                    h = _extend(h, t)
                key, ids = (len(ids), h), tuple(ids)
                table[key] = (None, ids) if key in table else (str(row["id"]), ids)
    return {"table": table, "lengths": {n for n, _ in table}, "longest": max((n for n, _ in table), default=0)}


def sample_of_row(ids: list[int], prompts: dict) -> str | None:
    """The id of the sample whose prompt ids the row starts with, the longest such prompt (a later turn of a
    conversation starts with an earlier one's prompt); None: no such sample, or two share that prompt. One
    pass over the row's first tokens, whatever the number of prompts: a dataset of 100k rows must not cost
    a comparison per row and prompt length."""
    h, lengths, table, found = 0, prompts["lengths"], prompts["table"], None
    for n, token in enumerate(ids[: prompts["longest"]], 1):
        h = _extend(h, token)
        if n in lengths and (hit := table.get((n, h))) and tuple(ids[:n]) == hit[1]:
            found = hit[0]
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--samples", type=Path)
    args = ap.parse_args()

    from datasets import load_from_disk

    ds = load_from_disk(str(args.data)).with_format(None).select_columns(["input_ids"])
    prompts = prompt_ids_of(args.samples) if args.samples is not None else None
    seq_len, digests, sample_ids = [], [], []
    for batch in ds.iter(batch_size=1024):
        for ids in batch["input_ids"]:
            seq_len.append(len(ids))
            digests.append(ids_digest(ids))
            if prompts is not None:
                sample_ids.append(sample_of_row(ids, prompts))
    index = {"num_samples": len(seq_len), "total_tokens": sum(seq_len), "seq_len": seq_len, "ids_sha256": digests,
             "hash": "sha256(int64 little-endian ids)[:16]"}
    if prompts is not None:
        index["sample_ids"] = sample_ids
    fd, tmp = tempfile.mkstemp(dir=args.out.parent, prefix=f".{args.out.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(index, fh, separators=(",", ":"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, args.out)
    print(f"indexed {len(seq_len)} samples, {sum(seq_len)} tokens -> {args.out}")


if __name__ == "__main__":
    main()
