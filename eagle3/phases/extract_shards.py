"""Extract's merge (its table row's `shards`): the shards' hidden-state files become the phase's own
hidden_states/, as hard links (no second copy on the shared disk), beside the prepared data every
shard rendered. The same files an unsharded run leaves, so training reads them unchanged.

Verified before the manifest vouches for the set: every shard prepared the same data (their
indexes of token ids agree: prepare-data is deterministic for the same samples), every file
0..n-1 is there exactly once, from the shard that owns it, and passes the same check as after an
unsharded extraction."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path

from ..config import PipelineConfig
from ..errors import GateError
from ..slices import Shard, contiguous
from ..fsio import atomic_write_bytes, atomic_write_json, link_or_copy, read_json
from . import products
from . import PhaseSummary
from .extract import PHASE, ExtractPaths, ExtractSummary, settings_fingerprint
from .extract_manifest import read_extract_manifest, write_manifest
from .hs_files import Expect, PreparedIndex, scan_dir


def _link_tree(src: Path, dst: Path) -> None:
    """dst becomes a tree of links to src's files, swapped in whole (a half-built tree is never dst)."""
    partial = dst.with_name(dst.name + ".merging")
    shutil.rmtree(partial, ignore_errors=True)
    for path in sorted(src.rglob("*")):
        target = partial / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(path, target)
    partial.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(partial, dst)


def merge_extract(cfg: PipelineConfig, shard_cfgs: list[PipelineConfig]) -> PhaseSummary:
    t0 = time.monotonic()
    count = len(shard_cfgs)
    parts = [ExtractPaths.of(s) for s in shard_cfgs]
    # Each shard read the run's samples through its own link to them: the same file by its hash.
    settings = {**read_json(parts[0].settings), "source_samples": str(products.samples(cfg))}
    first_index = parts[0].index.read_bytes()
    for i, part in enumerate(parts[1:], start=1):
        if part.index.read_bytes() != first_index:
            raise GateError(f"{Shard(PHASE, i, count).label} ({part.dir}) prepared other token ids than shard 1: the "
                            "shards did not render the same samples; delete the shard dirs and rerun extract")
        if {**read_json(part.settings), "source_samples": settings["source_samples"]} != settings:
            raise GateError(f"{Shard(PHASE, i, count).label} ({part.dir}) ran with other settings than shard 1; "
                            "delete the shard dirs and rerun extract")
    index = PreparedIndex.from_dict(read_json(parts[0].index))
    paths = ExtractPaths.of(cfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.manifest.unlink(missing_ok=True)  # vouches for the merged set only once it is checked
    atomic_write_json(paths.settings, settings)
    _link_tree(parts[0].prepared, paths.prepared)
    atomic_write_bytes(paths.index, first_index)
    paths.hidden_states.mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(parts):
        for idx in contiguous(index.num_samples, i, count):
            src = part.hidden_states / f"hs_{idx}.safetensors"
            if not src.is_file():
                raise GateError(f"{Shard(PHASE, i, count).label}: {src} is missing though the shard is done; rerun "
                                "extract (the shard redoes only its missing files)")
            link_or_copy(src, paths.hidden_states / src.name)
    shard_manifest = read_extract_manifest(shard_cfgs[0], check_config=False)
    expect = Expect(len(shard_manifest.layer_ids), shard_manifest.hidden_size, shard_manifest.dtype)
    scan = scan_dir(paths.hidden_states, index, expect)
    for stray in scan.strays:  # a file of an earlier, larger set: not part of this one
        if stray.is_dir():
            shutil.rmtree(stray, ignore_errors=True)
        else:
            stray.unlink(missing_ok=True)
    if scan.invalid or len(scan.valid) != index.num_samples:
        first = min(scan.invalid) if scan.invalid else None
        raise GateError(f"merged hidden states: {len(scan.valid)} of {index.num_samples} files valid"
                        + (f" (first invalid: {scan.invalid[first]})" if first is not None else ""))
    total_bytes = sum(b for b, _ in scan.valid.values())
    manifest = replace(shard_manifest, num_samples=index.num_samples, total_tokens=index.total_tokens,
                       total_bytes=total_bytes, prepared_data=str(paths.prepared),
                       token_freq=str(paths.prepared / "token_freq.pt") if (paths.prepared / "token_freq.pt").exists()
                       else None, hidden_states_dir=str(paths.hidden_states), source_samples=str(products.samples(cfg)),
                       settings_fingerprint=settings_fingerprint(settings), created_at=time.time(), extra={"shards": count})
    manifest_file = write_manifest(cfg, manifest)
    summaries = [read_json(p.summary) or {} for p in parts]
    summary = ExtractSummary(
        samples=index.num_samples, kept_files=sum(s.get("kept_files", 0) for s in summaries),
        new_files=sum(s.get("new_files", 0) for s in summaries),
        redone_files=sum(s.get("redone_files", 0) for s in summaries), total_tokens=index.total_tokens,
        total_bytes=total_bytes, estimated_bytes=summaries[0].get("estimated_bytes", 0),
        layer_ids=list(manifest.layer_ids), dtype=manifest.dtype,
        server_started=any(s.get("server_started") for s in summaries),
        prepared_reused=all(s.get("prepared_reused") for s in summaries), elapsed_s=round(time.monotonic() - t0, 3),
        manifest=str(manifest_file), hidden_states_dir=str(paths.hidden_states), mode="offline",
        exact_estimated_bytes=summaries[0].get("exact_estimated_bytes", 0))
    details = {**asdict(summary), "shards": count}
    atomic_write_json(paths.summary, details)
    return PhaseSummary(str(manifest_file), (
        f"{index.num_samples} hidden-state files merged from {count} shards ({summary.new_files} new), layers "
        f"{manifest.layer_ids}, {index.total_tokens} tokens, {total_bytes} bytes -> {manifest_file}"), details)


def files_written(phase_dir: Path) -> int:
    """Hidden-state files of an extract output (a shard's done count: each is renamed into place whole)."""
    return sum(1 for _ in (Path(phase_dir) / "hidden_states").glob("hs_*.safetensors"))
