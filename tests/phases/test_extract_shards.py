"""Extract's merge of its shards (phases/extract_shards.py), on shard dirs as sharded extraction
leaves them (each: the whole prepared data, its own rows' hidden-state files, a manifest): every
file linked once from the shard that owns it and checked, and shards that disagree refused."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict

import pytest

from eagle3.errors import GateError
from eagle3.fanout.node import shard_config
from eagle3.slices import Shard, contiguous
from eagle3.fsio import atomic_write_json
from eagle3.phases.extract import ExtractPaths
from eagle3.phases.extract_manifest import ExtractManifest, read_extract_manifest
from eagle3.phases.extract_shards import merge_extract

N, LAYERS, HIDDEN = 5, 4, 8
SEQ = [3, 5, 2, 4, 6]


def tokens(i: int) -> bytes:
    return struct.pack(f"<{SEQ[i]}q", *range(i, i + SEQ[i]))


def hs_file(path, i: int) -> None:
    hs = b"\0" * (SEQ[i] * LAYERS * HIDDEN * 4)
    header = {"hidden_states": {"dtype": "F32", "shape": [SEQ[i], LAYERS, HIDDEN], "data_offsets": [0, len(hs)]},
              "token_ids": {"dtype": "I64", "shape": [SEQ[i]], "data_offsets": [len(hs), len(hs) + len(tokens(i))]}}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + hs + tokens(i))


def index(seq=SEQ) -> dict:
    return {"seq_len": list(seq), "ids_sha256": [hashlib.sha256(tokens(i)).hexdigest()[:16] for i in range(N)]}


def write_shard(cfg, scfg, i: int, count: int, idx=None, settings=None, skip=()):
    p = ExtractPaths.of(scfg)
    (p.prepared / "data").mkdir(parents=True)
    (p.prepared / "data" / "part-0.arrow").write_bytes(b"arrow")
    (p.prepared / "token_freq.pt").write_bytes(b"freq")
    atomic_write_json(p.index, idx or index())
    atomic_write_json(p.settings, settings or {"source_samples": str(scfg.layout.samples), "source_sha256": "s"})
    p.hidden_states.mkdir(parents=True)
    for k in contiguous(N, i, count):
        if k not in skip:
            hs_file(p.hidden_states / f"hs_{k}.safetensors", k)
    m = ExtractManifest(layer_ids=[2, 4, 5, 8], aux_layer_ids=[2, 4, 5], last_layer_id=8, include_last_layer=True,
                        layer_id_convention="vllm", convention_note="", layer_ids_source="default",
                        num_hidden_layers=8, hidden_size=HIDDEN, dtype="float32", num_samples=len(contiguous(N, i, count)),
                        total_tokens=0, total_bytes=0, seq_length=512, prepared_data=str(p.prepared),
                        token_freq=None, hidden_states_dir=str(p.hidden_states), file_pattern="hs_{i}.safetensors",
                        target_model=str(cfg.target.model), served_name="tiny-llama",
                        source_samples=str(scfg.layout.samples), source_sha256="s", settings_fingerprint="f",
                        created_at=0.0)
    atomic_write_json(p.manifest, asdict(m))
    atomic_write_json(p.summary, {"new_files": len(contiguous(N, i, count))})


@pytest.fixture
def shards(make_config):
    cfg = make_config(check_files=False)
    return cfg, [shard_config(cfg, Shard("extract", i, 2)) for i in range(2)]


def test_every_file_is_linked_once_from_its_owner_and_the_manifest_covers_the_set(shards):
    cfg, parts = shards
    for i, scfg in enumerate(parts):
        write_shard(cfg, scfg, i, 2)
    summary = merge_extract(cfg, parts)
    hs = ExtractPaths.of(cfg).hidden_states
    assert sorted(f.name for f in hs.iterdir()) == sorted(f"hs_{i}.safetensors" for i in range(N))
    for k in range(N):
        owner = ExtractPaths.of(parts[0 if k in contiguous(N, 0, 2) else 1]).hidden_states / f"hs_{k}.safetensors"
        assert (hs / f"hs_{k}.safetensors").stat().st_ino == owner.stat().st_ino
    m = read_extract_manifest(cfg, check_config=False)
    assert (m.num_samples, m.total_tokens, m.hidden_states_dir) == (N, sum(SEQ), str(hs))
    assert (ExtractPaths.of(cfg).prepared / "data" / "part-0.arrow").read_bytes() == b"arrow"
    assert json.loads(ExtractPaths.of(cfg).settings.read_text())["source_samples"] == str(cfg.layout.samples)
    assert summary.details["new_files"] == N and summary.details["shards"] == 2


@pytest.mark.parametrize("case,match", [("index", "prepared other token ids"), ("settings", "other settings"),
                                        ("missing", "hs_4.safetensors is missing")])
def test_shards_that_disagree_or_lack_a_file_are_refused_and_nothing_vouches(shards, case, match):
    cfg, parts = shards
    write_shard(cfg, parts[0], 0, 2)
    write_shard(cfg, parts[1], 1, 2, idx=index([3, 5, 2, 4, 7]) if case == "index" else None,
                settings={"source_samples": "x", "source_sha256": "other"} if case == "settings" else None,
                skip=(4,) if case == "missing" else ())
    with pytest.raises(GateError, match=match):
        merge_extract(cfg, parts)
    assert not ExtractPaths.of(cfg).manifest.exists()
