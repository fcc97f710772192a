"""What the train phase leaves for the benchmark: train/manifest.json (which drafter to serve,
trained or not, its aux layer ids). The train phase writes it; the bench phase reads it here, never
through the train phase's module."""

from __future__ import annotations

from ..errors import ConfigError
from ..fsio import read_json

MANIFEST_SCHEMA = 1


def read_train_manifest(cfg) -> dict:
    path = cfg.layout.train_manifest
    data = read_json(path)
    if data is None:
        raise ConfigError(f"{path}: no training manifest; run the train phase first (`eagle3 train CONFIG`)")
    if data.get("schema") != MANIFEST_SCHEMA:
        raise ConfigError(f"{path}: manifest schema {data.get('schema')!r}, this pack reads {MANIFEST_SCHEMA}; "
                          "rerun the train phase")
    return data
