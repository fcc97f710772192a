"""Datagen's merge (its table row's `shards`): the shards' samples become the phase's own
samples.jsonl, each prompt of the set at most once, in the prompt set's order; the same files an
unsharded run leaves (samples, failures, manifest, summary), so extract reads it unchanged.

Verified before anything is written: every shard's settings are the run's, every row belongs to
its shard's slice, no id twice. The failed-prompts gate applies to the whole set, as unsharded."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from ..appendlog import recover
from ..config import PipelineConfig
from ..errors import GateError
from ..slices import Shard
from ..fsio import atomic_write_json, atomic_write_text, read_json
from ..layout import SAMPLES
from . import PhaseSummary
from .datagen import PHASE, DatagenPaths, DatagenSummary, content_settings, datagen_prompts, failed_prompts_gate

_SUMMED = ("new_samples", "resumed", "failed", "prompt_tokens", "completion_tokens", "retries")


def merge_datagen(cfg: PipelineConfig, shard_cfgs: list[PipelineConfig]) -> PhaseSummary:
    t0 = time.monotonic()
    prompts = datagen_prompts(cfg)
    settings = content_settings(cfg, prompts)
    count = len(shard_cfgs)
    rows: dict[str, dict] = {}
    failures: list[str] = []
    summaries: list[dict] = []
    for index, scfg in enumerate(shard_cfgs):
        sp = DatagenPaths.of(scfg)
        where = f"{Shard(PHASE, index, count).label} ({sp.dir})"
        manifest = read_json(sp.manifest) or {}
        if manifest.get("settings", settings) != settings:
            raise GateError(f"{where}: its samples were made with other settings than this run's; delete that shard "
                            "dir and rerun the phase to regenerate it")
        slice_ids = set(Shard(PHASE, index, count).take(prompts.ids))
        for row in recover(sp.samples):
            rid = row.get("id")
            if rid not in slice_ids:
                raise GateError(f"{where}: sample {rid!r} is not a prompt of that shard's slice; the shard dir is not "
                                "this run's: delete it and rerun the phase")
            if rid in rows:
                raise GateError(f"{where}: sample {rid!r} appears twice")
            rows[rid] = row
        if sp.failures.is_file():
            failures += [line for line in sp.failures.read_text().splitlines() if line.strip()]
        summaries.append(read_json(sp.summary) or {})

    paths = DatagenPaths.of(cfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    ordered = [rows[i] for i in prompts.ids if i in rows]
    atomic_write_text(paths.samples, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in ordered))
    atomic_write_text(paths.failures, "".join(line + "\n" for line in failures))
    first = read_json(DatagenPaths.of(shard_cfgs[0]).manifest) or {}
    atomic_write_json(paths.manifest, {**first, "created_at": time.time(), "config_hash": cfg.fingerprint(PHASE),
                                       "settings": settings, "shards": count,
                                       "shard_endpoints": [s.get("endpoint") for s in summaries]})
    summary = _summed(cfg, paths, summaries, len(ordered), len(prompts.prompts), len(prompts.problems), t0)
    details = {**asdict(summary), "complete": summary.complete, "shards": count}
    atomic_write_json(paths.summary, details)
    failed_prompts_gate(cfg, paths, summary, " in any shard")
    return PhaseSummary(summary.output, (
        f"{summary.samples}/{summary.total} samples merged from {count} shards ({summary.new_samples} new, "
        f"{summary.failed} failed), {summary.completion_tokens} tokens -> {summary.output}"), details)


def _summed(cfg: PipelineConfig, paths: DatagenPaths, summaries: list[dict], samples: int, total: int,
            invalid: int, t0: float) -> DatagenSummary:
    """The shards' counts added up; generation time is the longest shard's (they ran side by side)."""
    sums = {k: sum(int(s.get(k, 0) or 0) for s in summaries) for k in _SUMMED}
    generation_s = max((float(s.get("generation_s", 0) or 0) for s in summaries), default=0.0)
    return DatagenSummary(
        samples=samples, total=total, invalid_prompts=invalid, generation_s=round(generation_s, 3),
        elapsed_s=round(time.monotonic() - t0, 3), endpoint="; ".join(str(s.get("endpoint")) for s in summaries),
        model=cfg.target.served_name, output=str(Path(paths.samples)),
        output_tok_s=round(sums["completion_tokens"] / generation_s, 2) if generation_s > 0 else 0.0, **sums)


def rows_written(phase_dir: Path) -> int:
    """Complete rows of a datagen output (a shard's done count: each row is one finished sample)."""
    try:
        with open(Path(phase_dir) / SAMPLES, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except FileNotFoundError:
        return 0
