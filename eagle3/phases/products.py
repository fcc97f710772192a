"""The products one phase hands the next, asked for by what they are: the generated samples (datagen -> extract,
the bench's held-out split, the drafter's provenance) and the trained drafter (train -> bench, the
doctor). Where each lives is layout.py's; what a record holds is its producer's record module
(phases/train_manifest.py). A consumer asks here and never reads another phase's files by name."""

from __future__ import annotations

from pathlib import Path

from ..appendlog import read_rows
from ..errors import ConfigError
from ..fsio import read_json
from ..layout import DATAGEN_MANIFEST
from . import datagen_self_prompts
from .train_manifest import read_train_manifest


def samples(cfg) -> Path:
    """The generated training samples (JSONL, one conversation per row)."""
    return cfg.layout.samples


def sample_ids(cfg) -> set[str] | None:
    """The ids of the generated samples (None before data generation wrote any). Read-only and tolerant
    of a torn last row: a consumer must never modify the producer's files."""
    if not samples(cfg).exists():
        return None
    return {str(row["id"]) for row in read_rows(samples(cfg), "generated samples") if "id" in row}


def written_prompts(cfg) -> list:
    """The prompts the target wrote itself (datagen.self_prompts) that have a sample: they stand in no prompt
    file, only in the samples."""
    if not cfg.datagen.self_prompts or not samples(cfg).exists():
        return []
    return datagen_self_prompts.written_prompts(read_rows(samples(cfg), "generated samples"))


def prepared_sample_ids(cfg) -> list[str | None] | None:
    """Per row of the prepared dataset the trainer reads, in its order, the id of the sample it came from
    (None where unmatched); None when extraction recorded no such list (an index from before it did)."""
    ids = (read_json(cfg.layout.prepared_index) or {}).get("sample_ids")
    return list(ids) if isinstance(ids, list) else None


def generation_settings(samples_file: Path) -> dict:
    """The content-deciding settings the samples in `samples_file` were generated with (sampling,
    prompt set hash); {} when their record is gone."""
    return (read_json(Path(samples_file).with_name(DATAGEN_MANIFEST)) or {}).get("settings") or {}


def trained_drafter(cfg, required: bool = True) -> dict | None:
    """The train phase's record of the drafter to serve (checkpoint, engine, aux layers, trained or
    not). Without one: ConfigError naming the fix, or None when not `required`."""
    try:
        return read_train_manifest(cfg)
    except ConfigError:
        if required:
            raise
        return None
