"""The pipeline's phases, declared once. Everything else is derived from this table: the order,
each phase's upstream, the handoff's "next phase", the ports a handoff checks, the engines a
config must provide, phase-name validation, the CLI's and the Prefect flow's phase choices.

Adding a phase is one module (its function) plus one row. A row names its function as
"module:function", imported only when the phase runs, so that reading the table (the CLI's
`--help`, the doctor, `eagle3 status`) imports no engine adapter.

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
from typing import Callable, Iterator, Sequence

from .errors import ConfigError

TABLE_ENV = "EAGLE3_PHASE_TABLE"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Phase:
    name: str
    upstream: str | None  # the phase whose output this one consumes (the previous row)
    run: str  # "module:function" called as function(cfg, sup, on_progress) -> PhaseSummary (eagle3.phases)
    produces: str  # what <run_dir>/<name>/ holds once the phase is done
    server: bool = False  # serves a model: cfg.<name>.server (its port) with engine cfg.<name>.engine

    @property
    def module(self) -> str:
        return self.run.split(":", 1)[0]

    def function(self) -> Callable:
        module, func = self.run.split(":", 1)
        return getattr(importlib.import_module(module), func)


PIPELINE: tuple[Phase, ...] = (
    Phase("datagen", None, "eagle3.phases.datagen:run_datagen",
          "samples.jsonl: the target model's own answers to the prompts", server=True),
    Phase("extract", "datagen", "eagle3.phases.extract:run_extract",
          "hs_*.safetensors: the target's hidden states for every sample, and their manifest", server=True),
    Phase("train", "extract", "eagle3.phases.train:run_train",
          "the trained EAGLE-3 drafter (checkpoints, manifest.json)"),
    Phase("bench", "train", "eagle3.phases.bench:run_bench",
          "results.json, report.md, bench.png: baseline vs speculative decoding", server=True),
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
    """`base` with the functions of some phases swapped: {"train": "module:function"}."""
    return tuple(replace(p, run=runs.get(p.name, p.run)) for p in base)


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
        if not _NAME.match(r.name) or r.name in ("start", "end", "run"):
            raise ConfigError(f"{where}: phase name {r.name!r} must be lowercase letters, digits and '_' "
                              "(and not start, end or run, which the handoffs and progress use)")
        if r.upstream != previous:
            raise ConfigError(f"{where}: phase {r.name!r} has upstream {r.upstream!r}; it must be the row before "
                              f"it ({previous!r})")
        if ":" not in r.run:
            raise ConfigError(f"{where}: phase {r.name!r}: run must be 'module:function', got {r.run!r}")
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
    """The ports that must be free around `phase`: its server's, and the handoff's extra ports."""
    own = [section.port for name, section, _ in servers(cfg) if name == phase]
    if phase == "train" and cfg.hidden_states.mode != "offline":
        own.append(cfg.extract.server.port)  # the online train step serves hidden states from extract's server
    return own + list(cfg.handoff.extra_ports)
