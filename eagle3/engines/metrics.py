"""Speculative-decoding acceptance as the serving engine itself counts it.

vLLM exposes monotonically increasing counters on /metrics (Prometheus text format, `_total`
suffix, labels `engine` and `model_name`):
  vllm:spec_decode_num_drafts_total                          drafts (one per verify step and request)
  vllm:spec_decode_num_draft_tokens_total                    tokens proposed
  vllm:spec_decode_num_accepted_tokens_total                 tokens accepted
  vllm:spec_decode_num_accepted_tokens_per_pos_total{position="i"}
A measurement is the difference of two snapshots taken around a window; with several engines
(data parallel) the series are summed. From a delta:
  acceptance rate          = accepted / draft tokens
  mean acceptance length   = 1 + accepted / drafts      (the 1 is the bonus token of each step)
  per-position rate[i]     = accepted_per_pos[i] / drafts

SGLang (with --enable-metrics, which the adapter always passes) counts per finished request, labels
`model_name`: sglang:num_requests_total, sglang:generation_tokens_total (completion tokens) and
sglang:spec_verify_calls_total (verify steps). A request's completion is its prefill's token plus,
per verify step, the accepted drafts and one bonus token, so over a window
  drafts   = verify calls
  accepted = generation tokens - requests - verify calls
and the formulas above give vLLM's definitions (SGLang's own "accept length", completion tokens /
verify calls, also counts the prefill's token: higher by about 1/verify calls per request). SGLang
counts no acceptance per position. Its /server_info `avg_spec_accept_length` is an average since the
server started (warm-up included), kept only as a cross-check.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ..errors import TransientError

PREFIX = "vllm:spec_decode_"
DRAFTS = PREFIX + "num_drafts_total"
DRAFT_TOKENS = PREFIX + "num_draft_tokens_total"
ACCEPTED = PREFIX + "num_accepted_tokens_total"
ACCEPTED_PER_POS = PREFIX + "num_accepted_tokens_per_pos_total"
SGLANG_REQUESTS = "sglang:num_requests_total"
SGLANG_PROMPT_TOKENS = "sglang:prompt_tokens_total"
SGLANG_GENERATION_TOKENS = "sglang:generation_tokens_total"
SGLANG_VERIFY_CALLS = "sglang:spec_verify_calls_total"



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
    """One snapshot (or the difference of two) of vLLM's spec-decode counters, summed over engines."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()

    @classmethod
    def from_samples(cls, samples: list[Sample], model_name: str | None = None) -> "SpecCounters | None":
        """None when the server exposes no spec-decode counter (no speculative config)."""
        found = False
        totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
        per_pos: dict[int, float] = {}
        for s in samples:
            if not s.name.startswith(PREFIX) or not s.name.endswith("_total"):
                continue  # the `_created` gauges carry timestamps, not counts
            if model_name is not None and s.labels.get("model_name", model_name) != model_name:
                continue
            found = True
            if s.name in totals:
                totals[s.name] += s.value
            elif s.name == ACCEPTED_PER_POS and "position" in s.labels:
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
        if not found:
            return None
        width = max(per_pos) + 1 if per_pos else 0
        return cls(int(totals[DRAFTS]), int(totals[DRAFT_TOKENS]), int(totals[ACCEPTED]),
                   tuple(int(per_pos.get(i, 0.0)) for i in range(width)))

    @classmethod
    def parse(cls, text: str, model_name: str | None = None) -> "SpecCounters | None":
        return cls.from_samples(parse_prometheus(text), model_name)

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
    source: str = "vllm /metrics counter deltas"

    def to_dict(self) -> dict:
        return asdict(self)


def acceptance(delta: SpecCounters, source: str = "vllm /metrics counter deltas") -> Acceptance:
    """The formulas of the module docstring; None where the window holds no draft."""
    rate = delta.accepted / delta.draft_tokens if delta.draft_tokens else None
    length = 1.0 + delta.accepted / delta.drafts if delta.drafts else None
    per_pos = [n / delta.drafts for n in delta.accepted_per_pos] if delta.drafts else []
    return Acceptance(delta.drafts, delta.draft_tokens, delta.accepted, rate, length, per_pos, source)


VLLM_TRAFFIC = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
SGLANG_TRAFFIC = (SGLANG_REQUESTS, SGLANG_PROMPT_TOKENS, SGLANG_GENERATION_TOKENS)


@dataclass(frozen=True)
class Traffic:
    """What the server finished, by its own counters: lets a window prove that it holds exactly
    the load generator's requests (a foreign client on the port would show up here)."""

    requests: int = 0            # vllm:request_success_total, every finish reason
    prompt_tokens: int = 0       # vllm:prompt_tokens_total
    generation_tokens: int = 0   # vllm:generation_tokens_total

    @classmethod
    def from_samples(cls, samples: list[Sample], model_name: str | None = None,
                     names: tuple[str, str, str] | None = None) -> "Traffic":
        """`names`: the engine's (requests, prompt tokens, generation tokens) counters; vLLM's by default."""
        names = names or VLLM_TRAFFIC
        totals = _sums(samples, names, model_name)
        return cls(*(int(totals[n]) for n in names))

    def __sub__(self, before: "Traffic") -> "Traffic":
        return Traffic(self.requests - before.requests, self.prompt_tokens - before.prompt_tokens,
                       self.generation_tokens - before.generation_tokens)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Traffic":
        return cls(int(d["requests"]), int(d["prompt_tokens"]), int(d["generation_tokens"]))


def _sums(samples: list[Sample], names: tuple[str, ...], model_name: str | None) -> dict[str, float]:
    totals = dict.fromkeys(names, 0.0)
    for s in samples:
        if s.name in totals and (model_name is None or s.labels.get("model_name", model_name) == model_name):
            totals[s.name] += s.value
    return totals


def sglang_spec_counters(samples: list[Sample], k: int, model_name: str | None = None) -> SpecCounters | None:
    """SGLang's counters as vLLM's (module docstring); None before its first verify step is counted
    (a server without a drafter never counts one)."""
    if not any(s.name == SGLANG_VERIFY_CALLS and model_name in (None, s.labels.get("model_name", model_name))
               for s in samples):
        return None
    t = _sums(samples, (SGLANG_REQUESTS, SGLANG_GENERATION_TOKENS, SGLANG_VERIFY_CALLS), model_name)
    verify = int(t[SGLANG_VERIFY_CALLS])
    return SpecCounters(drafts=verify, draft_tokens=verify * k,
                        accepted=int(t[SGLANG_GENERATION_TOKENS]) - int(t[SGLANG_REQUESTS]) - verify)


# ---- scraping ----------------------------------------------------------------------------------

def _get(url: str, headers: dict[str, str] | None, timeout_s: float) -> httpx.Response:
    try:
        response = httpx.get(url, headers=headers or {}, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise MetricsError(f"GET {url} failed: {type(e).__name__}: {e}") from None
    if response.status_code != 200:
        raise MetricsError(f"GET {url}: HTTP {response.status_code}: {response.text[:300]}")
    return response


def fetch_samples(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> list[Sample]:
    """Every sample of the server's Prometheus /metrics now."""
    return parse_prometheus(_get(f"{base_url}/metrics", headers, timeout_s).text)


def scrape_vllm(base_url: str, model_name: str | None = None, headers: dict[str, str] | None = None,
                timeout_s: float = 10.0) -> SpecCounters | None:
    """The server's spec-decode counters now; None if it has none (serving without a drafter)."""
    return SpecCounters.parse(_get(f"{base_url}/metrics", headers, timeout_s).text, model_name)


def scrape_vllm_all(base_url: str, model_name: str | None = None, headers: dict[str, str] | None = None,
                    timeout_s: float = 10.0) -> tuple[SpecCounters | None, Traffic]:
    """Spec-decode counters (None without a drafter) and traffic counters from one /metrics read."""
    samples = fetch_samples(base_url, headers, timeout_s)
    return SpecCounters.from_samples(samples, model_name), Traffic.from_samples(samples, model_name)


def scrape_sglang_all(base_url: str, k: int, model_name: str | None = None, headers: dict[str, str] | None = None,
                      timeout_s: float = 10.0) -> tuple[SpecCounters | None, Traffic]:
    """SGLang's spec-decode counters (None until it counted a verify step) and traffic counters."""
    samples = fetch_samples(base_url, headers, timeout_s)
    return sglang_spec_counters(samples, k, model_name), Traffic.from_samples(samples, model_name, SGLANG_TRAFFIC)


def sglang_accept_length(base_url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> float | None:
    """SGLang's average accept length since the server started (None when not speculating)."""
    for path in ("/server_info", "/get_server_info"):  # the second is the deprecated name
        try:
            data = _get(f"{base_url}{path}", headers, timeout_s).json()
        except (MetricsError, ValueError):
            continue
        states = data.get("internal_states") or [{}]
        value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        return None
    raise MetricsError(f"{base_url}: neither /server_info nor /get_server_info answered")


def engine_version(base_url: str, paths: tuple[str, ...], headers: dict[str, str] | None = None) -> str:
    """The version the running server reports about itself at the first of `paths` that says one
    (an engine's version_paths); "unknown" if none does."""
    for path in paths:
        try:
            data = _get(f"{base_url}{path}", headers, 10.0).json()
        except (MetricsError, ValueError):
            continue
        if isinstance(data, dict) and data.get("version"):
            return str(data["version"])
    return "unknown"
