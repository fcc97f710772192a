"""The pipeline's phases, declared once. Everything else is derived from this table: the order,
each phase's upstream, the handoff's "next phase", the ports a handoff checks, the engines a
config must provide, phase-name validation, the CLI's and the Prefect flow's phase choices.

Adding a phase is one module (its function and its settings model) plus one row. The row is the
phase's whole declaration: its config section (the config schema is built from the rows), its
outputs (a phase is done only while they exist), its command (`eagle3 <name>`, with its help and
options), whether it serves a model, what the handoff purges after it, the report it prints. A
row names code as "module:name", imported only when needed, so that reading the table (the CLI's
`--help`, `eagle3 status`) imports no engine adapter.

Swapping the table (tests: instant stand-in phases, a phase under test) goes through one narrow
hook, read when the table is asked for, never at import:
  - in process: `with using(rows): ...`
  - across processes (`eagle3 run` in a subprocess, a Prefect worker's flow-run processes):
    EAGLE3_PHASE_TABLE=module:ATTRIBUTE names a sequence of Phase rows in an importable module.
docs/DESIGN.md ("The phase table") says why this hook and not a config key.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

from . import layout
from .errors import ConfigError

TABLE_ENV = "EAGLE3_PHASE_TABLE"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
# start/end/run: the handoffs' and progress' own names; the rest: sections every config has, and the
# CLI's fixed commands (a phase gets `eagle3 <name>`, which must not shadow one of them).
RESERVED = {"start", "end", "run", "name", "run_dir", "gpus", "target", "engines", "handoff", "hidden_states",
            "fanout", "validate", "doctor", "status"}


@dataclass(frozen=True)
class Option:
    """An option of the phase's own command (`eagle3 <phase> --flag VALUE`), passed to the phase
    function as the keyword `keyword` when given."""

    flag: str
    keyword: str
    help: str
    foreign_server: bool = False  # given, the phase uses a server someone else runs: no handoff on its ports


@dataclass(frozen=True)
class Phase:
    """One phase, declared whole. Strings name what is imported only when needed ("module:name")."""

    name: str
    upstream: str | None  # the phase whose output this one consumes (the previous row)
    run: str  # "module:function" called as function(cfg, sup, **options) -> PhaseSummary
    produces: str  # what <run_dir>/<name>/ holds once the phase is done
    settings: str | None = None  # "module:Model": the config section `<name>:` (None: the phase has none)
    outputs: tuple[str, ...] = ()  # under <run_dir>/<name>/, what a done phase still holds ("d/": a non-empty dir)
    help: str = ""  # `eagle3 <name> --help`
    server: bool = False  # serves a model: cfg.<name>.server (its port) with engine cfg.<name>.engine
    purge: tuple[str, ...] = ()  # scratch dirs under <run_dir>/<name>/ that every handoff empties
    report: str | None = None  # a file under <run_dir>/<name>/ printed when the phase ends (bench: report.md)
    options: tuple[Option, ...] = ()  # more options of `eagle3 <name>`
    keeps: str = "a rerun resumes where this stopped"  # what an interrupted run of the phase keeps
    publish: str | None = None  # "module:function(name, details)" an orchestrator calls with the summary's details
    written: str | None = None  # "module:function(phase_dir) -> int": items its output already holds, counted from
    # the files (a shard's done count for the coordinator, whatever its progress events said)
    shards: str | None = None  # "module:function(cfg, shard_cfgs) -> PhaseSummary": merges the phase's shards
    # (the phase function then takes `shard=(index, count)`); None: the phase runs on one node only

    @property
    def module(self) -> str:
        return self.run.split(":", 1)[0]

    def function(self) -> Callable:
        return _resolve(self.run)

    def count_written(self, phase_dir: Path) -> int | None:
        """Items the phase's output in `phase_dir` already holds (its row's `written`); None: not counted."""
        return _resolve(self.written)(phase_dir) if self.written else None

    def merge(self) -> Callable:
        """The function that merges the phase's shards (its row's `shards`)."""
        if not self.shards:
            raise ConfigError(f"phase {self.name!r} cannot be sharded (its table row names no merge)")
        return _resolve(self.shards)

    def settings_model(self):
        """The pydantic model of the phase's config section, or None."""
        return _resolve(self.settings) if self.settings else None

    def missing_outputs(self, phase_dir: Path) -> list[str]:
        """The declared outputs that are not there (a "d/" output must be a non-empty directory)."""
        missing = []
        for rel in self.outputs:
            path = Path(phase_dir) / rel
            ok = (path.is_dir() and any(path.iterdir())) if rel.endswith("/") else path.is_file()
            if not ok:
                missing.append(rel)
        return missing


def _resolve(spec: str):
    module, name = spec.split(":", 1)
    return getattr(importlib.import_module(module), name)


_S = "eagle3.phases."
PIPELINE: tuple[Phase, ...] = (
    Phase("datagen", None, _S + "datagen:run_datagen", "samples.jsonl: the target model's own answers to the prompts",
          settings=_S + "datagen_settings:Datagen", outputs=(layout.SAMPLES,), server=True,
          help="Phase 1 alone: regenerate the prompt set's answers with the target (resumes; refuses changed "
               "settings).",
          options=(Option("--base-url", "base_url", "Use this already running OpenAI-compatible server (e.g. "
                          "http://127.0.0.1:8000, no /v1) instead of starting the configured one.",
                          foreign_server=True),),
          keeps="finished rows are kept; rerun to resume", shards=_S + "datagen_shards:merge_datagen",
          written=_S + "datagen_shards:rows_written"),
    Phase("extract", "datagen", _S + "extract:run_extract",
          "hs_*.safetensors: the target's hidden states for every sample, and their manifest",
          settings=_S + "extract_settings:Extract", outputs=(layout.EXTRACT_MANIFEST,), server=True,
          help="Phase 2 alone: hidden states of phase 1's samples (resumes: valid files are kept, broken ones "
               "redone).",
          keeps="finished hidden-state files are kept; rerun to resume", shards=_S + "extract_shards:merge_extract",
          written=_S + "extract_shards:files_written"),
    Phase("train", "extract", _S + "train:run_train", "the trained EAGLE-3 drafter (checkpoints, manifest.json)",
          settings=_S + "train_settings:Train", outputs=(layout.TRAIN_MANIFEST,), purge=(layout.HS_CACHE,),
          help="Phase 3 alone: train the drafter (resumes, incl. an interrupted save), gate it for the serving "
               "engine and export it where that engine's layout differs. Without GPUs: an UNTRAINED dry-run "
               "checkpoint.",
          keeps="the trainer saves interrupted/ within train.stop_grace_s; rerun to resume from it"),
    Phase("bench", "train", _S + "bench:run_bench",
          "results.json, report.md: baseline vs speculative decoding",
          settings=_S + "bench_settings:Bench", outputs=(layout.BENCH_RESULTS, layout.BENCH_REPORT), server=True,
          report=layout.BENCH_REPORT, publish="tasks.bench_artifacts:publish_bench_artifacts",
          help="Phase 4 alone: baseline vs target + drafter for each k, on held-out prompts; writes results.json, "
               "report.md and a copy in bench-history/. Exit 1 if a trained drafter fails the "
               "acceptance gate.",
          keeps="finished server runs are kept in bench/servers/; a rerun reuses them"),
)

_swapped: list[tuple[Phase, ...]] = []


def table() -> tuple[Phase, ...]:
    """The active table: an in-process swap, else the one EAGLE3_PHASE_TABLE names, else PIPELINE."""
    if _swapped:
        return _swapped[-1]
    spec = os.environ.get(TABLE_ENV)
    return _load(spec) if spec else PIPELINE


@contextlib.contextmanager
def using(rows: Sequence[Phase]) -> Iterator[tuple[Phase, ...]]:
    """Run the block with another phase table (checked like any other)."""
    rows = validated(rows, "using()")
    _swapped.append(rows)
    try:
        yield rows
    finally:
        _swapped.remove(rows)


def with_runs(runs: dict[str, str], base: Sequence[Phase] = PIPELINE) -> tuple[Phase, ...]:
    """`base` with the functions of some phases swapped: {"train": "module:function"}. A swapped
    function promises none of the real phase's outputs (its row keeps its settings and server)."""
    return tuple(replace(p, run=runs[p.name], outputs=()) if p.name in runs else p for p in base)


def _load(spec: str) -> tuple[Phase, ...]:
    module, _, attr = spec.partition(":")
    try:
        rows = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{TABLE_ENV}={spec!r}: cannot load the phase table ({e}); give module:ATTRIBUTE of an "
                          "importable module, or unset it to run the pipeline's own phases") from None
    return validated(rows, f"{TABLE_ENV}={spec!r}")


def validated(rows: Sequence[Phase], where: str) -> tuple[Phase, ...]:
    """A table must be a chain: unique names, each phase's upstream the row before it."""
    rows = tuple(rows)
    if not rows or not all(isinstance(r, Phase) for r in rows):
        raise ConfigError(f"{where}: a phase table is a non-empty sequence of eagle3.phase_table.Phase rows")
    previous = None
    for r in rows:
        if not _NAME.match(r.name) or r.name in RESERVED:
            raise ConfigError(f"{where}: phase name {r.name!r} must be lowercase letters, digits and '_' "
                              f"(and not start, end or run, which the handoffs and progress use, nor a config "
                              f"section every pipeline has or a command of the CLI: "
                              f"{', '.join(sorted(RESERVED - {'start', 'end', 'run'}))})")
        if r.upstream != previous:
            raise ConfigError(f"{where}: phase {r.name!r} has upstream {r.upstream!r}; it must be the row before "
                              f"it ({previous!r})")
        for what, spec in (("run", r.run), ("settings", r.settings), ("publish", r.publish), ("shards", r.shards)):
            if spec is not None and ":" not in spec:
                raise ConfigError(f"{where}: phase {r.name!r}: {what} must be 'module:name', got {spec!r}")
        for rel in (*r.outputs, *r.purge, *([r.report] if r.report else [])):
            if Path(rel).is_absolute() or ".." in Path(rel).parts:
                raise ConfigError(f"{where}: phase {r.name!r}: {rel!r} must be a path inside the phase dir")
        previous = r.name
    return rows


# ---- derived ---------------------------------------------------------------------------------

def names() -> tuple[str, ...]:
    return tuple(p.name for p in table())


def get(name: str) -> Phase:
    for p in table():
        if p.name == name:
            return p
    raise ConfigError(f"unknown phase {name!r}; choose from {', '.join(names())}")


def check(name: str, option: str) -> str:
    """`name` if it is a phase, else a ConfigError naming the option and the choices."""
    if name not in names():
        raise ConfigError(f"{option}: unknown phase {name!r}; choose from {', '.join(names())}")
    return name


def select(only: str | None = None, from_: str | None = None) -> list[str]:
    """The phases a run does: all, `only` one, or `from_` one to the last."""
    for option, value in (("--only", only), ("--from", from_)):
        if value is not None:
            check(value, option)
    if only and from_:
        raise ConfigError("--only and --from cannot be combined; pick one")
    order = list(names())
    if only:
        return [only]
    return order[order.index(from_):] if from_ else order


def next_phase(after: str) -> str | None:
    """The phase that follows `after` ("start" = before the first phase); None after the last."""
    order = names()
    if after == "start":
        return order[0]
    i = order.index(after) if after in order else len(order)
    return order[i + 1] if i + 1 < len(order) else None


def servers(cfg) -> list[tuple[str, object, str]]:
    """(phase, its server section, its engine) of each phase that serves a model."""
    return [(p.name, getattr(cfg, p.name).server, getattr(cfg, p.name).engine) for p in table() if p.server]


def ports(cfg, phase: str) -> list[int]:
    """The ports that must be free around `phase`: its server's, those its section says it borrows
    (`borrowed_ports(cfg)`: the online train step runs extract's server), and the handoff's extra ports."""
    own = [section.port for name, section, _ in servers(cfg) if name == phase]
    borrowed = getattr(getattr(cfg, phase, None), "borrowed_ports", None)
    return own + (list(borrowed(cfg)) if borrowed else []) + list(cfg.handoff.extra_ports)


def scratch_dirs(run_dir: Path) -> list[Path]:
    """What every handoff empties: each row's `purge` dirs under its phase dir."""
    return [Path(run_dir) / p.name / rel for p in table() for rel in p.purge]
