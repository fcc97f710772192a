"""Phase 2: hidden-state extraction with the speculators CLI against vLLM.

Steps (all processes supervised; the server is always stopped before returning):
  1. before anything starts: resolve the layer ids (ConfigError if out of range), check that the
     settings match what the phase dir was built with, estimate the output size and refuse when it
     exceeds extract.max_disk_bytes or the free space;
  2. one vLLM server with --enable-scale-out (the render endpoint prepare-data needs) and the
     extract_hidden_states method with the hidden-states KV connector (on a CPU rehearsal: the
     pack's CPU variant, eagle3/engine_side/cpu_hidden_states_connector.py);
  3. `speculators prepare-data` on phase 1's samples.jsonl -> prepared/ (built in prepared.partial/,
     renamed when complete), then an index of its token ids (engine-side script);
  4. exact disk check; existing hs files are checked, invalid/truncated ones deleted;
  5. `speculators generate-offline-data --validate-outputs --fail-on-error` writes the missing
     files; every file is checked again; manifest.json is written last (atomically).

Files in run_dir/extract/:
  settings.json        content-affecting settings; a resume with other settings is refused
  prepared/            prepare-data output (arrow, token_freq.pt): training's --data-path
  prepared_index.json  per sample: seq_len and a hash of its input_ids
  hidden_states/       hs_{i}.safetensors: hidden_states [seq_len, n_layers, hidden], token_ids [seq_len]
  staging/             where the connector writes before the client renames into hidden_states/
  manifest.json        layer ids + convention, dtype, counts, paths (read_extract_manifest)
  summary.json, logs/
Resume: valid hs files are kept untouched; only missing and invalid ones are (re)generated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .. import progress
from . import products
from .. import engine_registry
from ..config import PipelineConfig
from ..layout import EXTRACT_MANIFEST, PREPARED_INDEX
from ..engines import hidden_states as hs_server
from ..engines import speculators_cli as spec_cli
from ..engines.serving import base_url, client_env, start_server
from ..errors import ConfigError, GateError, PipelineError, TransientError
from ..slices import contiguous
from ..fsio import atomic_write_json, read_json
from ..progress import PhaseProgress
from ..process.services import LaunchSpec, Process, Supervisor, StopOutcome
from . import PhaseSummary
from .extract_disk import (HEADER_BYTES, DiskSpaceError, bytes_per_token, check_disk, estimate_from_samples, exact_estimate)
from .extract_manifest import (CONVENTION, CONVENTION_NOTE, DTYPE_BYTES, FILE_PATTERN, ExtractManifest, LayerPlan, extraction_dtype, read_extract_manifest, resolve_layer_plan, write_manifest)
from .extract_progress import HsFileProgress
from .hs_files import Expect, PreparedIndex, Scan, scan_dir
from . import hs_mode

__all__ = ["run_extract", "read_extract_manifest", "ExtractManifest", "ExtractSummary", "ExtractPaths",
           "stop_leftovers"]

PHASE = "extract"
SMALL_FILE = 16 * 2**20  # model files up to this size are hashed; larger ones (weights) by name and size
log = logging.getLogger("eagle3.extract")
@dataclass(frozen=True)
class ExtractPaths:
    dir: Path

    prepared = property(lambda self: self.dir / "prepared")
    prepared_partial = property(lambda self: self.dir / "prepared.partial")
    index = property(lambda self: self.dir / PREPARED_INDEX)
    hidden_states = property(lambda self: self.dir / "hidden_states")
    staging = property(lambda self: self.dir / "staging")
    settings = property(lambda self: self.dir / "settings.json")
    manifest = property(lambda self: self.dir / EXTRACT_MANIFEST)
    summary = property(lambda self: self.dir / "summary.json")
    logs = property(lambda self: self.dir / "logs")

    @classmethod
    def of(cls, cfg: PipelineConfig) -> "ExtractPaths":
        return cls(cfg.phase_dir(PHASE))


@dataclass
class ExtractSummary:
    samples: int            # hs files = prepared rows
    kept_files: int         # valid files found at start, left untouched
    new_files: int          # written by this run (includes redone ones)
    redone_files: int       # invalid/truncated files found at start, deleted and regenerated
    total_tokens: int
    total_bytes: int
    estimated_bytes: int    # the pre-start estimate from phase 1
    layer_ids: list[int]
    dtype: str
    server_started: bool
    prepared_reused: bool
    elapsed_s: float
    manifest: str
    hidden_states_dir: str
    mode: str = "offline"               # hidden_states mode this phase ran in
    exact_estimated_bytes: int = 0      # the estimate from the prepared data (offline: vs total_bytes)


# ---- settings a resume must match ----------------------------------------------------------------

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _model_identity(model: Path) -> str:
    """Config, tokenizer and chat template by content; weights by name and size (hashing hundreds of
    GB would cost more than the check is worth)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(model).rglob("*") if p.is_file()):
        size = path.stat().st_size
        h.update(f"{path.relative_to(model)}:{size}:".encode())
        if size <= SMALL_FILE:
            h.update(_sha256(path).encode())
    return h.hexdigest()[:16]


def content_settings(cfg: PipelineConfig, plan: LayerPlan, dtype: str, samples: Path) -> dict:
    return {"target_model": str(cfg.target.model), "model_identity": _model_identity(cfg.target.model),
            "dtype": dtype, "seq_length": cfg.extract.seq_length, "layer_ids": list(plan.layer_ids),
            "layer_id_convention": CONVENTION, "source_samples": str(samples), "source_sha256": _sha256(samples),
            "prepare_seed": 0, "token_freq": True}


def settings_fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _check_settings(paths: ExtractPaths, settings: dict) -> None:
    old = read_json(paths.settings)
    if old is not None and old != settings:
        keys = sorted(k for k in set(old) | set(settings) if old.get(k) != settings.get(k))
        raise ConfigError(f"{paths.dir}: the hidden states there were made with other settings (changed: "
                          f"{', '.join(keys)}); restore them, or redo the phase (`eagle3 extract CONFIG --force`, "
                          "`eagle3 run --from extract --force extract`)")


# ---- supervised steps ------------------------------------------------------------------------------

def stop_leftovers(cfg: PipelineConfig, sup: Supervisor) -> list[StopOutcome]:
    """End what an earlier, killed run of this phase left running (its server still holds the port,
    its client may still write files). Only registry entries of this phase, each proven ours."""
    outcomes = sup.sweep(cfg.extract.server.stop_grace_s, phase=PHASE)
    for outcome in outcomes:
        if outcome.members:
            log.warning("extract: stopped leftover %s (group %s) with %s", outcome.name, outcome.pgid, outcome.signal)
    return outcomes


def _spec_env(cfg: PipelineConfig) -> dict[str, str]:
    # The speculators clients only talk HTTP and read files: hide the GPUs so that no stray CUDA
    # context of theirs can hold GPU memory the next phase's handoff would have to explain.
    return {**cfg.engines.speculators.env, "CUDA_VISIBLE_DEVICES": ""}


def _command(cfg: PipelineConfig, paths: ExtractPaths, name: str, argv: list[str], client: bool = False) -> LaunchSpec:
    """`client`: the command talks to the phase's extraction server (and needs the run's key)."""
    env = _spec_env(cfg)
    if client:
        env |= client_env(cfg, cfg.extract.server, "extract.server", env)
    return LaunchSpec(name=f"extract-{name}", argv=argv, log=paths.logs / f"{name}.log", phase=PHASE,
                      env=env, stop_grace_s=cfg.extract.server.stop_grace_s,
                      hang_timeout_s=cfg.extract.server.hang_timeout_s)


def _run_against(sup: Supervisor, server: Process, spec: LaunchSpec) -> None:
    """Run a client command of the server; if it fails because the server died, report that
    (retryable) instead of the client's own error."""
    try:
        sup.run(spec)
    except PipelineError:
        server.check_alive()
        raise


def _prepare(cfg: PipelineConfig, sup: Supervisor, server: Process, paths: ExtractPaths, samples: Path) -> None:
    shutil.rmtree(paths.prepared_partial, ignore_errors=True)  # prepare-data would skip a dir with .arrow files
    workers = max(1, min(cfg.extract.concurrency, (os.cpu_count() or 2) // 2))
    argv = spec_cli.prepare_data_argv(cfg.engines.speculators, cfg.target.model, samples, paths.prepared_partial,
                                      cfg.extract.seq_length, base_url(cfg.extract.server), workers=workers,
                                      trust_remote_code=cfg.target.trust_remote_code)
    progress.step(PHASE, f"speculators prepare-data: tokenising {samples.name} through the server's render endpoint")
    _run_against(sup, server, _command(cfg, paths, "prepare-data", argv, client=True))
    if not any(paths.prepared_partial.glob("*.arrow")):
        raise GateError(f"speculators prepare-data wrote no dataset to {paths.prepared_partial} "
                        f"(see {paths.logs / 'prepare-data.log'})")
    os.replace(paths.prepared_partial, paths.prepared)


def _index(cfg: PipelineConfig, sup: Supervisor, paths: ExtractPaths) -> PreparedIndex:
    if not paths.index.exists():
        script = hs_server.ENGINE_SIDE_DIR / "index_prepared.py"
        argv = [*cfg.engines.speculators.python_argv(), str(script), "--data", str(paths.prepared),
                "--out", str(paths.index), "--samples", str(products.samples(cfg))]
        progress.step(PHASE, "indexing the prepared data")
        sup.run(_command(cfg, paths, "index-prepared", argv))
    try:
        return PreparedIndex.from_dict(read_json(paths.index) or {})
    except (OSError, ValueError, KeyError) as e:
        paths.index.unlink(missing_ok=True)
        raise TransientError(f"{paths.index}: unreadable index of the prepared data ({e}); a rerun rebuilds it") from None


def _generate(cfg: PipelineConfig, sup: Supervisor, server: Process, paths: ExtractPaths, total: int,
              report: PhaseProgress, expected_bytes: int, shard: tuple[int, int] | None) -> None:
    argv = spec_cli.generate_offline_data_argv(cfg.engines.speculators, base_url(cfg.extract.server) + "/v1",
                                               paths.prepared, paths.hidden_states, cfg.extract.concurrency,
                                               served_name=cfg.target.served_name, world=shard)
    report.step(f"speculators generate-offline-data: writing hidden states (concurrency {cfg.extract.concurrency})")
    with HsFileProgress(paths.hidden_states, total, report, expected_bytes):
        _run_against(sup, server, _command(cfg, paths, "generate-offline-data", argv, client=True))


def _raise_if_disk_full(paths: ExtractPaths, exact, err: Exception) -> None:
    """A writer that died on a full disk often cannot even log why (its log is on that disk too), so
    its exit code alone would not say it: check the space the missing files need, and say so."""
    present = sum(p.stat().st_size for p in paths.hidden_states.glob("hs_*.safetensors"))
    try:
        check_disk(exact, present, paths.hidden_states, limit=None)
    except DiskSpaceError as full:
        raise DiskSpaceError(f"extraction stopped: the disk filled up while hidden states were written. {full}. "
                             "Complete files are kept; a half-written one fails the check and is redone on the "
                             "rerun.") from err


# ---- the phase -------------------------------------------------------------------------------------

def _clean_scan(paths: ExtractPaths, scan: Scan) -> None:
    for idx, reason in sorted(scan.invalid.items()):
        log.warning("extract: hs_%d.safetensors is invalid and will be regenerated: %s", idx, reason)
        (paths.hidden_states / f"hs_{idx}.safetensors").unlink(missing_ok=True)
    for path in scan.strays:
        log.warning("extract: removing %s (not a file of this dataset)", path.name)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def run_extract(cfg: PipelineConfig, sup: Supervisor,
                shard: tuple[int, int] | None = None) -> PhaseSummary:
    """Extract (or finish extracting) hidden states for phase 1's samples; returns the summary (details:
    the ExtractSummary, also written to summary.json). The caller holds the phase lock. `shard=(index,
    count)`: only that shard's contiguous part of the prepared rows (speculators' --world-size/--rank;
    extract_shards.py merges); the prepared data is always the whole set. Raises
    ConfigError before anything starts (layer ids, changed settings, max_disk_bytes), DiskSpaceError
    (free space), or a retryable error (server died)."""
    t0 = time.monotonic()
    paths = ExtractPaths.of(cfg)
    plan = resolve_layer_plan(cfg)  # before the phase dir is even created
    samples = products.samples(cfg)
    if not samples.is_file() or samples.stat().st_size == 0:
        raise ConfigError(f"phase 'extract' needs phase 1's output {samples}; run the datagen phase first "
                          "(`eagle3 run --only datagen`)")
    paths.dir.mkdir(parents=True, exist_ok=True)
    summary = _extract(cfg, sup, paths, plan, samples, PhaseProgress(PHASE, unit="samples"), t0, shard)
    files = (f"{summary.samples} hidden-state files ({summary.kept_files} kept, {summary.new_files} new, "
             f"{summary.redone_files} redone)" if summary.mode == "offline" else
             f"{summary.samples} samples prepared, hidden states {summary.mode} (no files)")
    return PhaseSummary(summary.manifest, (
        f"{files}, layers {summary.layer_ids} (vllm convention), {summary.total_tokens} tokens, "
        f"{summary.total_bytes} bytes -> {summary.manifest}"), asdict(summary))


def _extract(cfg: PipelineConfig, sup: Supervisor, paths: ExtractPaths, plan: LayerPlan, samples: Path,
             report: PhaseProgress, t0: float, shard: tuple[int, int] | None) -> ExtractSummary:
    dtype, per_token, settings, estimate, present = _preflight(cfg, paths, plan, samples)
    stop_leftovers(cfg, sup)
    shutil.rmtree(paths.staging, ignore_errors=True)  # half-written connector files of a killed run
    paths.staging.mkdir(parents=True)
    paths.hidden_states.mkdir(parents=True, exist_ok=True)
    # The dtype is enforced only where the config names it; "auto" accepts what vLLM chose.
    explicit = cfg.extract.hidden_states_dtype != "auto" or cfg.target.dtype != "auto"
    expect = Expect(len(plan.layer_ids), plan.hidden_size, dtype if explicit else None)

    server: Process | None = None
    prepared_reused = paths.prepared.is_dir()

    def ensure_server() -> Process:
        nonlocal server
        if server is None:
            engine = engine_registry.get(cfg.extract.engine)
            flags, env = engine.extraction_server(cfg, sup, list(plan.layer_ids), dtype, paths.staging)
            server = start_server(sup, cfg, PHASE, engine.name, cfg.extract.server, extra_args=flags, env=env)
        return server

    try:
        if not prepared_reused:
            paths.index.unlink(missing_ok=True)
            _prepare(cfg, sup, ensure_server(), paths, samples)
        index = _index(cfg, sup, paths)
        exact = exact_estimate(index.num_samples, index.total_tokens, per_token)
        largest = max(index.seq_len, default=0) * per_token + HEADER_BYTES
        decision = hs_mode.decide(cfg, exact, hs_mode.free_bytes(paths.dir)[0] + present, largest)
        progress.note(PHASE, f"hidden states {decision.line()}")
        log.info("extract: hidden states %s", decision.line())
        owned = contiguous(index.num_samples, *shard) if shard else range(index.num_samples)
        if shard and decision.mode == "online":
            raise ConfigError(f"sharded extraction writes hidden-state files, but they do not fit: {decision.line()}; "
                              "free disk under run_dir, or run extract unsharded (fanout.shards.extract: 1)")
        if decision.mode == "online":
            # Nothing to write here: the train phase produces each sample's file on demand.
            return _finish_online(cfg, paths, plan, dtype, samples, settings, index, estimate, decision,
                                  server is not None, prepared_reused, t0)
        before = scan_dir(paths.hidden_states, index, expect, owned)
        _clean_scan(paths, before)
        check_disk(exact, sum(b for b, _ in before.valid.values()), paths.hidden_states, cfg.extract.max_disk_bytes)
        missing = len(owned) - len(before.valid)
        if missing:
            log.info("extract: %d of %d hidden-state files to write (%d valid kept, %d invalid redone)",
                     missing, len(owned), len(before.valid), len(before.invalid))
            try:
                _generate(cfg, sup, ensure_server(), paths, len(owned), report, exact.bytes, shard)
            except PipelineError as e:
                _raise_if_disk_full(paths, exact, e)
                raise
        else:
            report(len(owned), len(owned), bytes_written=sum(b for b, _ in before.valid.values()))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(paths.staging, ignore_errors=True)

    return _finish_offline(cfg, paths, plan, samples, settings, index, expect, before, estimate, exact, decision,
                           server is not None, prepared_reused, t0, owned)


def _preflight(cfg: PipelineConfig, paths: ExtractPaths, plan: LayerPlan, samples: Path):
    """Before anything starts: the settings the outputs will belong to (refused if existing outputs have
    others), the estimate from phase 1's counts, and the disk check where the files will be written."""
    dtype = extraction_dtype(cfg)
    per_token = bytes_per_token(len(plan.layer_ids), plan.hidden_size, DTYPE_BYTES[dtype])
    settings = content_settings(cfg, plan, dtype, samples)
    _check_settings(paths, settings)  # a forced redo (eagle3.phase_runner.run_phase) has removed them already
    estimate = estimate_from_samples(samples, cfg.extract.seq_length, per_token)
    present = sum(p.stat().st_size for p in paths.hidden_states.glob("hs_*.safetensors")) \
        if paths.hidden_states.is_dir() else 0
    # Offline or online (hidden_states.mode): from phase 1's counts now, from the exact prepared
    # data later; files already written count as free space (they are part of the estimate).
    decision = hs_mode.decide(cfg, estimate, hs_mode.free_bytes(paths.dir)[0] + present)
    if decision.mode == "offline":
        check_disk(estimate, present, paths.hidden_states, cfg.extract.max_disk_bytes)
    atomic_write_json(paths.settings, settings)  # from here on, outputs belong to these settings
    # The manifest vouches for a complete set; it is rewritten only after the final check.
    paths.manifest.unlink(missing_ok=True)
    paths.summary.unlink(missing_ok=True)
    log.info("extract: layers %s (%s convention), %s", list(plan.layer_ids), CONVENTION, estimate.describe())
    return dtype, per_token, settings, estimate, present


def _finish_offline(cfg: PipelineConfig, paths: ExtractPaths, plan: LayerPlan, samples: Path, settings: dict,
                    index: PreparedIndex, expect: Expect, before: Scan, estimate, exact, decision,
                    server_started: bool, prepared_reused: bool, t0: float, owned: range) -> ExtractSummary:
    """Every file checked again before the manifest vouches for the set (a shard's: its own files)."""
    after = scan_dir(paths.hidden_states, index, expect, owned)
    absent = [i for i in owned if i not in after.valid and i not in after.invalid]
    if after.invalid:
        first = min(after.invalid)
        raise GateError(f"{len(after.invalid)} hidden-state files are invalid after generation "
                        f"(first: {after.invalid[first]}); see {paths.logs}")
    if absent:
        raise TransientError(f"{len(absent)} hidden-state files missing after generation (first: hs_{absent[0]}); "
                             "a rerun generates only those")
    dtypes = {d for _, d in after.valid.values()}
    if len(dtypes) != 1:
        raise GateError(f"hidden-state files disagree on dtype: {sorted(dtypes)}")
    total_bytes = sum(b for b, _ in after.valid.values())
    manifest = _manifest(cfg, paths, plan, dtypes.pop(), samples, settings, index, total_bytes,
                         str(paths.hidden_states), FILE_PATTERN, "offline", decision)
    if len(owned) != index.num_samples:  # a shard: its files are a part of the set
        manifest = replace(manifest, extra={"files": [owned.start, owned.stop]})
    manifest_file = write_manifest(cfg, manifest)
    kept = len(before.valid)
    summary = ExtractSummary(
        samples=len(owned), kept_files=kept, new_files=len(owned) - kept,
        redone_files=len(before.invalid), total_tokens=index.total_tokens, total_bytes=total_bytes,
        estimated_bytes=estimate.bytes, layer_ids=list(plan.layer_ids), dtype=manifest.dtype,
        server_started=server_started, prepared_reused=prepared_reused,
        elapsed_s=round(time.monotonic() - t0, 3), manifest=str(manifest_file),
        hidden_states_dir=str(paths.hidden_states), mode="offline", exact_estimated_bytes=exact.bytes)
    atomic_write_json(paths.summary, asdict(summary))
    return summary


def _manifest(cfg: PipelineConfig, paths: ExtractPaths, plan: LayerPlan, dtype: str, samples: Path, settings: dict,
              index: PreparedIndex, total_bytes: int, hs_dir: str, pattern: str, mode: str,
              decision: hs_mode.Decision) -> ExtractManifest:
    token_freq = paths.prepared / "token_freq.pt"
    return ExtractManifest(
        layer_ids=list(plan.layer_ids), aux_layer_ids=list(plan.aux_layer_ids), last_layer_id=plan.last_layer_id,
        include_last_layer=plan.last_layer_id is not None, layer_id_convention=CONVENTION,
        convention_note=CONVENTION_NOTE, layer_ids_source=plan.source, num_hidden_layers=plan.num_hidden_layers,
        hidden_size=plan.hidden_size, dtype=dtype, num_samples=index.num_samples,
        total_tokens=index.total_tokens, total_bytes=total_bytes, seq_length=cfg.extract.seq_length,
        prepared_data=str(paths.prepared), token_freq=str(token_freq) if token_freq.exists() else None,
        hidden_states_dir=hs_dir, file_pattern=pattern, target_model=str(cfg.target.model),
        served_name=cfg.target.served_name, source_samples=str(samples), source_sha256=settings["source_sha256"],
        settings_fingerprint=settings_fingerprint(settings), created_at=time.time(), mode=mode, decision=decision.to_dict())


def _finish_online(cfg: PipelineConfig, paths: ExtractPaths, plan: LayerPlan, dtype: str, samples: Path,
                   settings: dict, index: PreparedIndex, estimate, decision: hs_mode.Decision, server_started: bool,
                   prepared_reused: bool, t0: float) -> ExtractSummary:
    """Online: the prepared data and the manifest (same layer ids, same convention) are this phase's
    whole output; offline files an earlier offline attempt left are not trusted for training."""
    shutil.rmtree(paths.hidden_states, ignore_errors=True)
    cache = cfg.layout.hs_cache
    manifest = _manifest(cfg, paths, plan, dtype, samples, settings, index, 0, str(cache),
                         "on demand: {request_id}.safetensors, deleted by the trainer once loaded", "online", decision)
    manifest_file = write_manifest(cfg, manifest)
    summary = ExtractSummary(
        samples=index.num_samples, kept_files=0, new_files=0, redone_files=0, total_tokens=index.total_tokens,
        total_bytes=0, estimated_bytes=estimate.bytes, layer_ids=list(plan.layer_ids), dtype=dtype,
        server_started=server_started, prepared_reused=prepared_reused, elapsed_s=round(time.monotonic() - t0, 3),
        manifest=str(manifest_file), hidden_states_dir=str(cache), mode="online",
        exact_estimated_bytes=decision.offline_bytes)
    atomic_write_json(paths.summary, asdict(summary))
    return summary
