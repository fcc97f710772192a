"""The pipeline config: the sections every pipeline has, plus one section per phase, built from the
phase table (each row's settings model). A different table (tests, an added phase) gets its own
model; `config_model()` builds it once per table."""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Annotated

from pydantic import Field, ValidationError, create_model, field_validator

from .. import phase_table
from ..errors import echo
from ..layout import RunLayout
from .fanout import Fanout
from .. import engine_registry
from .types import Engines, engines_model, FsPath, Handoff, HiddenStates, Strict, Target

# Keys of a server section that never change what a phase produces: where its key comes from, and
# whether it may bind beyond loopback. Left out of every fingerprint (adding them changed none).
SERVER_UNFINGERPRINTED = {"allow_remote", "api_key_env", "api_key_secret_block"}


class PipelineConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description=(
        "The pipeline's name (Prefect run names, artifact keys, the bench history)."))
    run_dir: FsPath = Field(description=(
        "Where every phase's output and the run's state go; created if missing. Refused: system directories "
        "and anything inside them, `$HOME` or above it, the pack's checkout (or above it, or its sources), a "
        "file or a path below one, a directory not writable."))
    gpus: list[Annotated[int, Field(strict=True, ge=0)]] = Field(default_factory=list, description=(
        "GPU indices in PCI order, distinct; empty: a CPU rehearsal."))
    target: Target = Field(description="The target model (`target` below).")
    engines: Engines = Field(description="How to run each engine (`engines.*` below); each engine a phase uses "
                                         "must be given.")
    handoff: Handoff = Field(Handoff(), description="The GPU handoff between phases (`handoff` below).")
    hidden_states: HiddenStates = Field(HiddenStates(), description=(
        "Where training's hidden states come from (`hidden_states` below; docs/pipeline.md, \"Hidden-state modes\")."))
    fanout: Fanout | None = Field(None, description=(
        "Run some phases as shards on several nodes through Prefect work pools (`fanout` below; docs/fanout.md). "
        "Unset: everything runs on this node."))

    @field_validator("gpus")
    @classmethod
    def _gpus_distinct(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"GPU ids must be distinct, got {echo(v)}")
        return v

    # ---- derived -----------------------------------------------------------------------------
    @property
    def cpu_rehearsal(self) -> bool:
        return not self.gpus

    def phase_ports(self, phase: str) -> list[int]:
        return phase_table.ports(self, phase)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    def phase_dir(self, phase: str) -> Path:
        return self.layout.phase_dir(phase)

    def section(self, phase: str):
        """The phase's settings, or None for a phase without a section."""
        return getattr(self, phase, None)

    def fingerprint(self, section: str | None = None) -> str:
        """Stable hash of the whole config or of one phase's section with the target (secrets excluded,
        and what each section's FINGERPRINT_EXCLUDE leaves out). A pipeline-wide section a phase names
        in FINGERPRINT_ALSO counts once it differs from its defaults, so configs written before it
        keep their fingerprints."""
        rows = [p for p in phase_table.table() if p.settings]
        exclude = {p.name: _exclusions(type(getattr(self, p.name))) for p in rows if hasattr(self, p.name)}
        data = self.model_dump(mode="json", exclude=exclude)
        for p in rows:
            for name in getattr(type(getattr(self, p.name, None)), "FINGERPRINT_UNSET", ()):
                if (data.get(p.name) or {}).get(name, 0) is None:
                    del data[p.name][name]
        data.pop("fanout", None)  # where shards ran never changes what a phase produced
        data["target"].pop("data_parallel_size", None)  # nor how many copies of the target served it
        optional = {name: data.pop(name) for name in ("hidden_states",)}
        also: set[str] = set()
        if section is not None:
            data = {"target": data["target"], section: data.get(section)}  # a phase may have no section
            also = set(getattr(self.section(section), "FINGERPRINT_ALSO", ()))
        else:
            also = {name for p in rows if hasattr(self, p.name) for name in type(getattr(self, p.name)).FINGERPRINT_ALSO}
        for name, value in optional.items():
            if name in also and value != type(getattr(self, name))().model_dump(mode="json"):
                data[name] = value
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _exclusions(model) -> dict:
    """model_dump's `exclude` for one section: its own FINGERPRINT_EXCLUDE, plus the unfingerprinted
    keys of its server."""
    own = dict(getattr(model, "FINGERPRINT_EXCLUDE", {}))
    if "server" in model.model_fields:
        own["server"] = set(own.get("server", set())) | SERVER_UNFINGERPRINTED
    return own


def config_model(rows: tuple | None = None) -> type[PipelineConfig]:
    """The config model of a phase table (default: the active one) and of the registered engines."""
    return _build(tuple(rows) if rows is not None else phase_table.table(), engine_registry.names())


@functools.lru_cache(maxsize=16)
def _build(rows: tuple, engines: tuple[str, ...]) -> type[PipelineConfig]:
    fields = {}
    if engines != tuple(engine_registry.BUILTIN):
        fields["engines"] = (engines_model(engines), PipelineConfig.model_fields["engines"])
    for p in rows:
        model = p.settings_model()
        if model is None:
            continue
        default = _default(model)
        described = Field(description=f"Phase `{p.name}` ({p.produces}); `{p.name}` below.") if default is None \
            else Field(default, description=f"Phase `{p.name}` ({p.produces}); `{p.name}` below.")
        fields[p.name] = (model, described)
    return create_model("PipelineConfig", __base__=PipelineConfig, **fields)


def _default(model):
    """The section's defaults when every field has one (the section may then be left out), else None."""
    try:
        return model()
    except ValidationError:
        return None
