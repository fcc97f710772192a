"""Broken copies of a real drafter, for gates that must catch what breaks between training and serving."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from eagle3.safetensors_header import read_header


def corrupt_vocab_map(src: Path, dst: Path, fraction: float = 1.0, seed: int = 0) -> Path:
    """A copy of the drafter whose draft -> target vocabulary map (d2t offsets) points `fraction` of
    the draft tokens at a neighbouring target token: what a map from another run or tokenizer does.
    The weights are untouched, so the drafter still predicts as trained; only what serving reads of it is wrong."""
    shutil.copytree(src, dst)
    weights = Path(dst) / "model.safetensors"
    info = read_header(weights).tensors["d2t"]
    assert info.dtype == "I64", info
    with open(weights, "r+b") as fh:
        fh.seek(info.begin)
        d2t = np.frombuffer(fh.read(info.nbytes), dtype="<i8").copy()
        target_vocab = int(read_header(weights).tensors["t2d"].shape[0])
        rng = np.random.default_rng(seed)
        pick = rng.random(d2t.size) < fraction
        ids = np.arange(d2t.size) + d2t
        step = np.where(ids + 1 < target_vocab, 1, -1)
        d2t[pick] += step[pick]
        fh.seek(info.begin)
        fh.write(d2t.astype("<i8").tobytes())
    return Path(dst)
