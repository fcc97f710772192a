"""Every path under a run dir, named once.

  <run_dir>/
    <phase>/                 each phase's output (what the phase table says it produces)
    bench-history/           every benchmark result kept across reruns
    doctor/                  the doctor's engine probes and its last report
    handoffs/                one JSON report per GPU handoff, named <UTC stamp>-<label>-<pid>.json
    shards/<phase>/<i>-of-<n>/   shard i of n (from 1, as "shard i/n" everywhere) of a fanned-out phase: a run dir of its own (its state/, handoffs/,
                             logs/ and <phase>/ output), on storage every node mounts (docs/fanout.md)
    logs/                    run-level logs (the run's own Prefect server; server-starts.jsonl: one row per engine
                             server start, with its seconds to ready)
    state/                   the run's bookkeeping, never a phase's output:
      services.json, services.lock, owner-token   the supervised-process registry
      run.lease                                   held by the live run (eagle3.process.lease)
      run.json, progress.json                     what `eagle3 status` reads
      <phase>.done.json, <phase>.started.json     the phase markers (eagle3.phase_runner)
      <phase>.lock                                held while the phase runs (eagle3.phases.phase_lock)
      failures.json, failures.lock                failure signatures for the retry policy
      doctor-cache.json                           the doctor's cached engine probes
      shards.json                                 the coordinator's view of a fanned-out phase's shards, and its earlier runs
      heartbeat.json                              (a shard's run dir) rewritten every few seconds while it runs
      prefect-results/                            the Prefect cache's stored phase results
      configs/<run id>.yaml                       the config each run started with, pinned (eagle3.config.pinned)
      compile-cache/                              the servers' compile cache where the user's is not provably
                                                  theirs; compile-scratch/<server>/: a start with no cache key

A Supervisor takes a state dir, not a run dir (tools that have no run dir give it a scratch
folder), so the registry's file names are constants here too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

STATE = "state"
REGISTRY = "services.json"
REGISTRY_LOCK = "services.lock"
OWNER_TOKEN = "owner-token"

# Files one phase writes and another reads (or the phase table names as outputs): named here only.
SAMPLES = "samples.jsonl"              # datagen/
PREPARED_INDEX = "prepared_index.json"  # extract/
DATAGEN_MANIFEST = "manifest.json"     # datagen/, beside its samples
EXTRACT_MANIFEST = "manifest.json"     # extract/
TRAIN_MANIFEST = "manifest.json"       # train/
HS_CACHE = "hs-cache"                  # train/, emptied by every handoff (the train row's purge)
BENCH_RESULTS = "results.json"         # bench/
BENCH_REPORT = "report.md"             # bench/


def state_dir(run_dir: Path) -> Path:
    """Where a run dir keeps its registry and owner token; the handoff looks here too."""
    return Path(run_dir) / STATE


@dataclass(frozen=True)
class RunLayout:
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def state(self) -> Path:
        return state_dir(self.root)

    # ---- the state dir -------------------------------------------------------------------------
    @property
    def registry(self) -> Path:
        return self.state / REGISTRY

    @property
    def lease(self) -> Path:
        return self.state / "run.lease"

    @property
    def run_record(self) -> Path:
        return self.state / "run.json"

    @property
    def progress(self) -> Path:
        return self.state / "progress.json"

    @property
    def failures(self) -> Path:
        return self.state / "failures.json"

    @property
    def failures_lock(self) -> Path:
        return self.state / "failures.lock"

    @property
    def doctor_cache(self) -> Path:
        return self.state / "doctor-cache.json"

    @property
    def shards_record(self) -> Path:
        return self.state / "shards.json"

    @property
    def heartbeat(self) -> Path:
        return self.state / "heartbeat.json"

    @property
    def prefect_results(self) -> Path:
        return self.state / "prefect-results"

    @property
    def pinned_configs(self) -> Path:
        return self.state / "configs"

    def pinned_config(self, run_id: str) -> Path:
        return self.pinned_configs / f"{run_id}.yaml"

    def done_marker(self, phase: str) -> Path:
        return self.state / f"{phase}.done.json"

    def started_marker(self, phase: str) -> Path:
        return self.state / f"{phase}.started.json"

    def phase_lock(self, phase: str) -> Path:
        # Beside the markers, not in the phase dir: a forced phase's dir is deleted while it is held.
        return self.state / f"{phase}.lock"

    # ---- beside the phases ---------------------------------------------------------------------
    def phase_dir(self, phase: str) -> Path:
        return self.root / phase

    @property
    def samples(self) -> Path:
        return self.phase_dir("datagen") / SAMPLES

    @property
    def prepared_index(self) -> Path:
        return self.phase_dir("extract") / PREPARED_INDEX

    @property
    def train_manifest(self) -> Path:
        return self.phase_dir("train") / TRAIN_MANIFEST

    @property
    def bench_report(self) -> Path:
        return self.phase_dir("bench") / BENCH_REPORT

    @property
    def hs_cache(self) -> Path:
        """Where the extraction server writes on-demand hidden states for an online train step; every
        handoff empties it (the train row's `purge`): nothing in it outlives the step that wrote it."""
        return self.phase_dir("train") / HS_CACHE

    def shard_run_dir(self, phase: str, index: int, count: int) -> Path:
        return self.root / "shards" / phase / f"{index + 1}-of-{count}"  # as the shard is named: "shard 2/2"

    def shard_run_dirs(self) -> list[Path]:
        """Every shard run dir there is, by phase and index."""
        return sorted(p for p in (self.root / "shards").glob("*/*-of-*") if p.is_dir())

    @property
    def handoffs(self) -> Path:
        return self.root / "handoffs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def server_starts(self) -> Path:
        return self.logs / "server-starts.jsonl"

    @property
    def doctor(self) -> Path:
        return self.root / "doctor"

    @property
    def compile_cache(self) -> Path:
        return self.state / "compile-cache"

    def compile_scratch(self, server: str) -> Path:
        return self.state / "compile-scratch" / server

    @property
    def bench_history(self) -> Path:
        return self.root / "bench-history"
