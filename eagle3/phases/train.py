"""Phase 3: train the EAGLE-3 drafter on phase 2's hidden states, gate it for the serving engine,
and export it to that engine's layout where it differs.

Files in the phase dir (cfg.phase_dir("train")):
  checkpoints/       speculators' save path: epoch dirs 0..E-1, interrupted/, .set-aside/ (GPU runs)
  dry-run/           the initialised, UNTRAINED checkpoint of `speculators train --dry-run` (no GPU)
  export-<engine>/   the checkpoint rewritten for the engine (only where its layout differs)
  gate.json          the gate report of the checkpoint to serve (written pass or fail)
  manifest.json      written last, only when the gate passed (schema below)
  logs/train.log     the trainer's output

manifest.json: schema, trained (false for a dry run), status ("TRAINED" or "UNTRAINED: ..."),
checkpoint (the dir to serve), source_checkpoint (the trainer's dir), engine (gated for),
aux_layer_ids (as stored in `checkpoint`, in `aux_layer_ids_convention`, the engine's),
aux_layer_ids_vllm (same layers, vllm convention = the extraction manifest's), draft_vocab_size,
num_speculative_tokens, epochs, epochs_completed, global_step, resume (what was resumed or
adopted), val_full_acc (the last validation's per-position accuracy in the trainer's log; None for a
dry run), target_model, extract_manifest, gate, created_at.

speculators' trainer needs an accelerator. With train.dry_run "auto" and no GPUs (a CPU
rehearsal) the phase runs `--dry-run`: a real, loadable checkpoint that was never trained, and
every artifact says so (trained: false, status UNTRAINED).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from ..drafters.loadable import GateReport, check_drafter, needs_export
from ..config import PipelineConfig
from ..drafters.export import export_drafter
from .. import engine_registry
from ..engines import trainer_compat
from ..engines.serving import client_env
from ..drafters.formats import LAYER_INPUT, LAYOUT_CONVENTION, PROVENANCE, layout_of
from ..engines.speculators_cli import train_argv, validation_rows
from ..errors import CommandFailed, ConfigError, GateError, PipelineError, TrainingStopped
from ..fsio import atomic_write_json, fsync_dir
from ..layout import TRAIN_MANIFEST
from ..progress import PhaseProgress
from ..process.services import LaunchSpec, Supervisor
from .train_resume import INTERRUPTED, checkpoint_freq_allows_resume, finished_checkpoint, prepare_resume
from .. import managed
from . import products
from . import PhaseSummary, train_online
from .extract_manifest import ExtractManifest, manifest_path, read_extract_manifest
from .train_log import follow_training, validation_by_epoch
from .train_manifest import MANIFEST_SCHEMA, read_train_manifest

PHASE = "train"
UNTRAINED = ("UNTRAINED: speculators train --dry-run (no accelerator); initialised weights, not a result - "
             "acceptance measured with it says nothing about a trained drafter")


@dataclass(frozen=True)
class TrainPaths:
    dir: Path

    @classmethod
    def of(cls, cfg: PipelineConfig) -> "TrainPaths":
        return cls(cfg.phase_dir(PHASE))

    checkpoints = property(lambda self: self.dir / "checkpoints")
    dry_run = property(lambda self: self.dir / "dry-run")
    manifest = property(lambda self: self.dir / TRAIN_MANIFEST)
    gate = property(lambda self: self.dir / "gate.json")
    log = property(lambda self: self.dir / "logs" / "train.log")

    def export(self, engine: str) -> Path:
        return self.dir / f"export-{engine}"


def use_dry_run(cfg: PipelineConfig) -> bool:
    mode = cfg.train.dry_run
    if mode == "never" and cfg.cpu_rehearsal:
        raise ConfigError("train.dry_run: 'never' needs GPUs (speculators' trainer needs an accelerator) but 'gpus' "
                          "is empty; list the GPUs in 'gpus', or set train.dry_run to auto for a CPU rehearsal")
    return mode == "always" or (mode == "auto" and cfg.cpu_rehearsal)


def serving_engine(cfg: PipelineConfig) -> str:
    return cfg.bench.engine


def trainer_gpus(cfg: PipelineConfig, ext: ExtractManifest) -> list[int]:
    """All of `gpus`; online, only hidden_states.train_gpus (the server has the others)."""
    return list(cfg.hidden_states.train_gpus if ext.mode == "online" else cfg.gpus)


def build_argv(cfg: PipelineConfig, ext: ExtractManifest, save_path: Path, dry_run: bool,
               kernel_flags: list[str] = ()) -> list[str]:
    """`kernel_flags`: the loss/attention choices of eagle3.engines.trainer_compat for the installed versions."""
    env = cfg.engines.speculators
    if env is None:
        raise ConfigError("engines.speculators: training runs the speculators CLI; set engines.speculators")
    extra = (list(engine_registry.get(serving_engine(cfg)).drafter_train_flags) + list(kernel_flags)
             + list(cfg.train.extra_args))
    return train_argv(
        env, target=cfg.target.model, data_path=Path(ext.prepared_data), hidden_states_path=Path(ext.hidden_states_dir),
        save_path=save_path, target_layer_ids=ext.target_layer_ids, epochs=cfg.train.epochs, lr=cfg.train.lr,
        total_seq_len=cfg.train.total_seq_len, draft_vocab_size=cfg.train.draft_vocab_size,
        ttt_steps=cfg.train.num_speculative_tokens,
        hidden_states_dtype="float32" if ext.dtype == "float32" else "bfloat16",
        dry_run=dry_run, nproc=max(1, len(trainer_gpus(cfg, ext))), trust_remote_code=cfg.target.trust_remote_code,
        extra_args=extra, vllm_endpoint=train_online.endpoint(cfg) if ext.mode == "online" else None)


def _launch(cfg: PipelineConfig, sup: Supervisor, argv: list[str], paths: TrainPaths, prog: PhaseProgress,
            gpus: list[int] | None = None, online: bool = False) -> None:
    """`online`: the trainer asks the extraction server for hidden states (and needs the run's key)."""
    env = {**cfg.engines.speculators.env, "COLUMNS": "240"}  # rich wraps the trainer's log at the terminal width
    if online:
        env |= client_env(cfg, cfg.extract.server, "extract.server", env)
    spec = LaunchSpec(name="train-speculators", argv=argv, log=paths.log, phase=PHASE,
                      env=env,
                      cwd=paths.dir, gpus=list(cfg.gpus if gpus is None else gpus), stop_grace_s=cfg.train.stop_grace_s,
                      hang_timeout_s=cfg.train.hang_timeout_s,
                      progress_paths=[paths.dir])  # checkpoints written count as progress, not only log lines
    paths.log.parent.mkdir(parents=True, exist_ok=True)
    with follow_training(paths.log, cfg.train.epochs, prog):
        sup.run(spec)


def _dry_run(cfg: PipelineConfig, sup: Supervisor, ext: ExtractManifest, paths: TrainPaths,
             prog: PhaseProgress, kernel: list[str]) -> Path:
    """Write the untrained checkpoint into a scratch dir, then rename it into place."""
    staging = paths.dir / f".dry-run-{uuid.uuid4().hex[:8]}"
    prog.step("speculators train --dry-run (no accelerator): writing an initialised, UNTRAINED checkpoint")
    try:
        _launch(cfg, sup, build_argv(cfg, ext, staging, dry_run=True, kernel_flags=kernel), paths, prog,
                trainer_gpus(cfg, ext), online=ext.mode == "online")
        if not (staging / "config.json").is_file() or not (staging / "model.safetensors").is_file():
            raise PipelineError(f"speculators train --dry-run exited 0 without writing config.json and "
                                f"model.safetensors into {staging}; see {paths.log}")
        old = paths.dir / f".dry-run-old-{uuid.uuid4().hex[:8]}"
        if paths.dry_run.exists():
            os.rename(paths.dry_run, old)
        os.rename(staging, paths.dry_run)
        fsync_dir(paths.dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return paths.dry_run


def _train(cfg: PipelineConfig, sup: Supervisor, ext: ExtractManifest, paths: TrainPaths,
           prog: PhaseProgress, kernel: list[str]) -> tuple[Path, dict]:
    save = paths.checkpoints
    save.mkdir(parents=True, exist_ok=True)
    plan = prepare_resume(save, step_known=checkpoint_freq_allows_resume(list(cfg.train.extra_args)))
    resume = plan.to_dict()
    done = finished_checkpoint(save, cfg.train.epochs)
    if done is None:
        prog.step(f"speculators train: {cfg.train.epochs} epoch(s) on {max(1, len(cfg.gpus))} process(es)"
                  + (f", resuming from {plan.latest.path}" if plan.latest else ""))
        try:
            _launch(cfg, sup, build_argv(cfg, ext, save, dry_run=False, kernel_flags=kernel), paths, prog,
                    trainer_gpus(cfg, ext), online=ext.mode == "online")
        except CommandFailed as e:
            if (save / INTERRUPTED).is_dir():
                raise TrainingStopped(f"training was stopped (exit code {e.returncode}); its interrupt checkpoint "
                                      f"{save / INTERRUPTED} is kept and a rerun resumes from it", e.log_tail) from e
            raise
        done = finished_checkpoint(save, cfg.train.epochs)
        if done is None:
            if (save / INTERRUPTED).is_dir():
                raise TrainingStopped(f"training was stopped before epoch {cfg.train.epochs} ended; the trainer saved "
                                      f"{save / INTERRUPTED} and a rerun resumes from it")
            raise PipelineError(f"speculators train exited 0 but {save / str(cfg.train.epochs - 1)} is not a complete "
                                f"end-of-training checkpoint (extra_args such as --max-steps or --checkpoint-freq?); "
                                f"see {paths.log}")
    else:
        resume["actions"].append(f"training already complete at {done.path}; trainer not started")
    resume["epochs_completed"] = done.epoch + 1
    resume["global_step"] = done.global_step
    return done.path, resume


_NO_RESUME = {"resume_from": None, "actions": [], "epochs_completed": 0, "global_step": 0}


def _online(cfg: PipelineConfig, sup: Supervisor, ext: ExtractManifest, paths: TrainPaths, prog: PhaseProgress,
            dry: bool, kernel: list[str]) -> tuple[Path, dict, dict]:
    """Online mode (train_online.py): the extraction server beside the trainer. A CPU rehearsal's
    trainer can only --dry-run, which builds no data loader: before it, every sample goes through
    speculators' own on-demand data path against the same server (engine_side/online_fetch.py)."""
    t0 = time.monotonic()
    fetched = None
    with train_online.extraction_server(cfg, sup, ext) as (_server, guard):
        if dry:
            fetched = train_online.fetch_check(cfg, sup, ext, paths.dir / "online-fetch.json",
                                               paths.dir / "logs" / "online-fetch.log")
            source, resume = _dry_run(cfg, sup, ext, paths, prog, kernel), _NO_RESUME
        else:
            source, resume = _train(cfg, sup, ext, paths, prog, kernel)
    extra = {"seconds": round(time.monotonic() - t0, 1), "server_gpus": list(cfg.hidden_states.server_gpus),
             "train_gpus": list(cfg.hidden_states.train_gpus), "endpoint": train_online.endpoint(cfg),
             "fetched_samples": len(fetched["samples"]) if fetched else None,
             "fetch_samples_per_s": fetched["samples_per_s"] if fetched else None}
    return source, resume, train_online.record(paths.dir / "online.json", guard.stats, extra)


def gate_for_engine(cfg: PipelineConfig, source: Path, engine: str, aux_vllm: list[int],
                    paths: TrainPaths) -> tuple[Path, GateReport]:
    """Export where the engine's layout differs, then gate what will be served."""
    served = source
    if needs_export(source, engine):
        served = export_drafter(source, paths.export(engine), engine, source_convention=LAYER_INPUT)
    report = check_drafter(served, engine, target=cfg.target.model, expected_aux_ids=aux_vllm)
    atomic_write_json(paths.gate, report.to_dict())
    return served, report


def data_provenance(cfg: PipelineConfig, ext: ExtractManifest) -> dict:
    """What the drafter learned from: phase 1's sampling (its manifest beside the samples file), the sizes,
    and the ids of the samples its validation accuracy was measured on (the serve-parity gate serves
    their prompts: text drawn like the training data that the drafter never trained on)."""
    settings = products.generation_settings(Path(ext.source_samples))
    rows = products.prepared_sample_ids(cfg)
    held = None
    if rows is not None:
        split = validation_rows(len(rows), managed.flag_value(list(cfg.train.extra_args), "--train-data-ratio"))
        held = [rows[i] for i in split if rows[i] is not None]
    return {"samples": ext.num_samples, "tokens": ext.total_tokens, "source_samples": ext.source_samples,
            "sampling": settings.get("sampling"), "prompts_sha256": settings.get("prompts_sha256"),
            "validation_ids": held}


def run_train(cfg: PipelineConfig, sup: Supervisor) -> PhaseSummary:
    """Train (or resume training) the drafter and gate it for the serving engine; details: the
    manifest written beside the checkpoint."""
    prog = PhaseProgress(PHASE, unit="epochs")
    paths = TrainPaths.of(cfg)
    ext = read_extract_manifest(cfg)
    dry = use_dry_run(cfg)
    engine = serving_engine(cfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    paths.manifest.unlink(missing_ok=True)  # a manifest always describes the checkpoint beside it
    total = cfg.train.epochs
    if not dry:  # a dry run trains no epoch: its progress is the step it runs
        prog(0, total)
    t0 = time.time()
    online = None
    versions = trainer_compat.trainer_versions(cfg, sup)
    if (why := trainer_compat.conflict(cfg, versions)) and not dry:
        raise ConfigError(why)  # the doctor says so first; a run without it must not pay for a doomed start
    kernel = trainer_compat.trainer_flags(cfg, versions)
    if ext.mode == "online":
        source, resume, online = _online(cfg, sup, ext, paths, prog, dry, kernel)
    elif dry:
        source, resume = _dry_run(cfg, sup, ext, paths, prog, kernel), _NO_RESUME
    else:
        source, resume = _train(cfg, sup, ext, paths, prog, kernel)
    prog.step(f"checkpoint gate for {engine}")
    served, report = gate_for_engine(cfg, source, engine, list(ext.target_layer_ids), paths)
    if not report.ok:
        raise GateError(f"the {'dry-run' if dry else 'trained'} drafter fails the {engine} checkpoint gate "
                        f"(details in {paths.gate}):\n" + report.render())
    by_epoch = [] if dry else validation_by_epoch(paths.log)  # the log read once: every epoch's, the last one's
    manifest = {
        "schema": MANIFEST_SCHEMA, "trained": not dry, "status": UNTRAINED if dry else "TRAINED",
        "checkpoint": str(served), "source_checkpoint": str(source), "engine": engine,
        "aux_layer_ids": report.aux_layer_ids, "aux_layer_ids_convention": LAYOUT_CONVENTION[layout_of(engine)],
        "aux_layer_ids_vllm": list(ext.target_layer_ids),
        "draft_vocab_size": report.draft_vocab_size, "num_speculative_tokens": cfg.train.num_speculative_tokens,
        "epochs": total, "epochs_completed": resume.get("epochs_completed", 0),
        "global_step": resume.get("global_step", 0), "resume": resume,
        "target_model": str(cfg.target.model), "extract_manifest": str(manifest_path(cfg)),
        "gate": report.to_dict(), "train_log": str(paths.log), "seconds": round(time.time() - t0, 1),
        "val_full_acc": by_epoch[-1] if by_epoch else None,
        "val_full_acc_by_epoch": by_epoch,
        "created_at": time.time(), "hidden_states_mode": ext.mode, "online": online,
        "trainer": {"versions": versions, "kernel_flags": kernel}, "data": data_provenance(cfg, ext),
    }
    # Beside the checkpoint, so that it travels with it: what it learned from, and what training measured
    # (the serve-parity gate's expectation wherever the drafter is benchmarked later: bench.drafter).
    atomic_write_json(Path(served) / PROVENANCE, {
        "data": manifest["data"], "trainer": manifest["trainer"], "trained": manifest["trained"],
        "target_model": str(cfg.target.model),
        "training": {k: manifest[k] for k in ("val_full_acc", "epochs_completed", "global_step",
                                              "num_speculative_tokens", "draft_vocab_size", "aux_layer_ids_vllm")}})
    atomic_write_json(paths.manifest, manifest)
    if not dry:
        prog(manifest["epochs_completed"], total)
    return PhaseSummary(str(served), (
        f"{manifest['status']}: checkpoint {served} (gated for {engine}, aux layer ids {report.aux_layer_ids} in the "
        f"{manifest['aux_layer_ids_convention']} convention), epochs {manifest['epochs_completed']}/{total}, "
        f"global step {manifest['global_step']}"), manifest)


__all__ = ["run_train", "read_train_manifest", "TrainPaths", "TrainingStopped", "use_dry_run", "build_argv",
           "gate_for_engine", "UNTRAINED"]
