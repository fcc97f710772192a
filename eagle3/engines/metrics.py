"""Speculative-decoding acceptance as the serving engine itself counts it, read from its Prometheus
/metrics. Which counters an engine has, and how they map onto SpecCounters and Traffic, is its own
module's to say (eagle3/engines/vllm.py, sglang.py); what every engine's counters mean is here.

A measurement is the difference of two snapshots taken around a window; with several engines (data
parallel) the series are summed. From a delta:
  acceptance rate          = accepted / draft tokens
  mean acceptance length   = 1 + accepted / drafts      (the 1 is the bonus token of each step)
  per-position rate[i]     = accepted_per_pos[i] / drafts
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..errors import TransientError

class MetricsError(TransientError):
    """/metrics could not be read or makes no sense (e.g. a counter went backwards: restarted server)."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition, parsed by prometheus_client; comments, blank and
    malformed lines are skipped. Line by line: one bad line (an engine's plugin, a proxy's banner)
    must not cost the counters, and the parser refuses a whole text for one bad line."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except ValueError:
            continue
        out += [Sample(s.name, dict(s.labels), float(s.value)) for f in families for s in f.samples]
    return out


@dataclass(frozen=True)
class SpecCounters:
    """One snapshot (or the difference of two) of a server's spec-decode counters, summed over engines."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    def __sub__(self, before: "SpecCounters") -> "SpecCounters":
        width = max(len(self.accepted_per_pos), len(before.accepted_per_pos))
        after_pos = self.accepted_per_pos + (0,) * (width - len(self.accepted_per_pos))
        before_pos = before.accepted_per_pos + (0,) * (width - len(before.accepted_per_pos))
        delta = SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                             self.accepted - before.accepted, tuple(a - b for a, b in zip(after_pos, before_pos)))
        if min(delta.drafts, delta.draft_tokens, delta.accepted, *delta.accepted_per_pos, 0) < 0:
            raise MetricsError(f"spec-decode counters went backwards ({before} -> {self}): the server restarted "
                               "during the window, so the window cannot be measured; rerun the phase")
        return delta

    def __add__(self, other: "SpecCounters") -> "SpecCounters":
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + (0,) * (width - len(self.accepted_per_pos))
        b = other.accepted_per_pos + (0,) * (width - len(other.accepted_per_pos))
        return SpecCounters(self.drafts + other.drafts, self.draft_tokens + other.draft_tokens,
                            self.accepted + other.accepted, tuple(x + y for x, y in zip(a, b)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accepted_per_pos"] = list(self.accepted_per_pos)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SpecCounters":
        return cls(int(d["drafts"]), int(d["draft_tokens"]), int(d["accepted"]), tuple(d.get("accepted_per_pos", ())))


@dataclass(frozen=True)
class Acceptance:
    """Acceptance over one window. Rates are fractions (0..1), not percent."""

    drafts: int
    draft_tokens: int
    accepted: int
    acceptance_rate: float | None
    acceptance_length: float | None
    per_position: list[float] = field(default_factory=list)
    source: str = "/metrics counter deltas"

    def to_dict(self) -> dict:
        return asdict(self)


def acceptance(delta: SpecCounters, source: str = "/metrics counter deltas") -> Acceptance:
    """The formulas of the module docstring; None where the window holds no draft."""
    rate = delta.accepted / delta.draft_tokens if delta.draft_tokens else None
    length = 1.0 + delta.accepted / delta.drafts if delta.drafts else None
    per_pos = [n / delta.drafts for n in delta.accepted_per_pos] if delta.drafts else []
    return Acceptance(delta.drafts, delta.draft_tokens, delta.accepted, rate, length, per_pos, source)


@dataclass(frozen=True)
class Traffic:
    """What the server finished, by its own counters: lets a window prove that it holds exactly
    the load generator's requests (a foreign client on the port would show up here)."""

    requests: int = 0            # requests finished, every finish reason
    prompt_tokens: int = 0
    generation_tokens: int = 0

    @classmethod
    def from_samples(cls, samples: list[Sample], model_name: str | None, names: tuple[str, str, str]) -> "Traffic":
        """`names`: the engine's (requests, prompt tokens, generation tokens) counters."""
        totals = sums(samples, names, model_name)
        return cls(*(int(totals[n]) for n in names))

    def __sub__(self, before: "Traffic") -> "Traffic":
        return Traffic(self.requests - before.requests, self.prompt_tokens - before.prompt_tokens,
                       self.generation_tokens - before.generation_tokens)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Traffic":
        return cls(int(d["requests"]), int(d["prompt_tokens"]), int(d["generation_tokens"]))


def sums(samples: list[Sample], names: tuple[str, ...], model_name: str | None) -> dict[str, float]:
    """{name: the sum of its series} for the series of `model_name` (None: all)."""
    totals = dict.fromkeys(names, 0.0)
    for s in samples:
        if s.name in totals and (model_name is None or s.labels.get("model_name", model_name) == model_name):
            totals[s.name] += s.value
    return totals


# ---- scraping ----------------------------------------------------------------------------------

def get(url: str, headers: dict[str, str] | None, timeout_s: float) -> httpx.Response:
    try:
        response = httpx.get(url, headers=headers or {}, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise MetricsError(f"GET {url} failed: {type(e).__name__}: {e}") from None
    if response.status_code != 200:
        raise MetricsError(f"GET {url}: HTTP {response.status_code}: {response.text[:300]}")
    return response


def fetch_samples(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> list[Sample]:
    """Every sample of the server's Prometheus /metrics now."""
    return parse_prometheus(get(f"{base_url}/metrics", headers, timeout_s).text)


def engine_version(base_url: str, paths: tuple[str, ...], headers: dict[str, str] | None = None) -> str:
    """The version the running server reports about itself at the first of `paths` that says one
    (an engine's version_paths); "unknown" if none does."""
    for path in paths:
        try:
            data = get(f"{base_url}{path}", headers, 10.0).json()
        except (MetricsError, ValueError):
            continue
        if isinstance(data, dict) and data.get("version"):
            return str(data["version"])
    return "unknown"
