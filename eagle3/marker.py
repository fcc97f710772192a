"""A finished phase's DONE marker (`state/<phase>.done.json`) as a typed record. eagle3.phase_runner
writes it and says when it is valid; everything that reads one reads this type."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields


@dataclass(frozen=True)
class DoneMarker:
    phase: str
    config: str | None  # the phase's config fingerprint (PipelineConfig.fingerprint(phase))
    upstream: str | None  # the fingerprint of the output it consumed; None: it consumed none
    code: str  # package version + the phase module's hash, for the reader (never part of validity)
    started_at: float
    finished_at: float
    summary: dict  # eagle3.phases.PhaseSummary.to_dict()
    force_token: str | None  # the flow run that forced it (a retry of that run keeps its fresh output)
    fingerprint: str = ""  # this output's own: what a downstream phase records as its upstream

    @classmethod
    def sealed(cls, **values) -> DoneMarker:
        """A new marker, its fingerprint the hash of everything else it records (so a redo, even of
        the same config, gets a new one and invalidates what is downstream)."""
        body = {k: v for k, v in values.items() if k != "fingerprint"}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return cls(**body, fingerprint=digest)

    @classmethod
    def from_dict(cls, data) -> DoneMarker | None:
        """The marker a file holds; None for anything that is not one (no marker: the phase is not done)."""
        if not isinstance(data, dict):
            return None
        names = {f.name for f in fields(cls)}
        if not {"phase", "fingerprint"} <= set(data):
            return None
        known = {k: v for k, v in data.items() if k in names}
        defaults = {"config": None, "upstream": None, "code": "", "started_at": 0.0, "finished_at": 0.0,
                    "summary": {}, "force_token": None}
        return cls(**(defaults | known))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def headline(self) -> str:
        return str(self.summary.get("headline", ""))
