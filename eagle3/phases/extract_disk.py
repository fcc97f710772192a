"""Disk preflight for phase 2: hidden states are large (8·H bytes per token at 4 layers × bf16:
32 KiB/token for H=4096), so the phase estimates its output before it starts anything and refuses
when the limit or the filesystem cannot hold it, printing both numbers.

Estimate before the server starts: per phase-1 row, the token count the server reported at
generation (meta.prompt_tokens + meta.completion_tokens), capped at extract.seq_length (prepare-data
truncates there); a row without counts is assumed full length (an upper bound). prepare-data emits
one row per assistant turn, so earlier turns are prorated by their share of the characters. After
prepare-data the exact token count replaces the estimate and the check runs again.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, PipelineError

HEADER_BYTES = 256  # safetensors header of an hs file: ~150 bytes of JSON plus the 8-byte length


class DiskSpaceError(PipelineError):
    """The filesystem lacks room for the hidden states; freeing space (not retrying) helps."""


@dataclass(frozen=True)
class Estimate:
    rows: int
    tokens: int
    bytes_per_token: int
    bytes: int
    upper_bound_rows: int  # rows without token counts, counted at full seq_length
    exact: bool            # from the prepared data rather than the phase-1 counts
    basis: str = "phase 1"  # what a non-exact estimate comes from

    def describe(self) -> str:
        how = "exact, from the prepared data" if self.exact else f"estimated from {self.basis}"
        extra = f"; {self.upper_bound_rows} rows without token counts taken at seq_length" if self.upper_bound_rows else ""
        return (f"{fmt_bytes(self.bytes)} = {self.tokens} tokens × {self.bytes_per_token} B/token "
                f"+ {self.rows} file headers ({how}{extra})")


def fmt_bytes(n: int) -> str:
    return f"{n} bytes ({n / 2**30:.3f} GiB)"


def bytes_per_token(num_layers: int, hidden_size: int, dtype_bytes: int) -> int:
    return num_layers * hidden_size * dtype_bytes + 8  # + the int64 token id


def _row_turn_tokens(row: dict, seq_length: int) -> tuple[list[int], bool]:
    conv = row.get("conversations") or []
    meta = row.get("meta") or {}
    p, c = meta.get("prompt_tokens"), meta.get("completion_tokens")
    total = p + c if isinstance(p, int) and isinstance(c, int) and p + c > 0 else None
    sizes = [len(str(t.get("content") or "")) for t in conv if isinstance(t, dict)]
    all_chars = max(1, sum(sizes))
    out, upto = [], 0
    for j, turn in enumerate(conv):
        upto += sizes[j] if j < len(sizes) else 0
        if j == 0 or not isinstance(turn, dict) or turn.get("role") != "assistant":
            continue
        out.append(seq_length if total is None else min(seq_length, math.ceil(total * upto / all_chars)))
    return out, total is not None


def estimate_from_samples(samples: Path, seq_length: int, per_token: int) -> Estimate:
    rows = tokens = upper = 0
    with open(samples, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line: datagen's resume cuts it; it yields no sample here
            turns, counted = _row_turn_tokens(row, seq_length)
            rows += len(turns)
            tokens += sum(turns)
            upper += 0 if counted else len(turns)
    return Estimate(rows, tokens, per_token, tokens * per_token + rows * HEADER_BYTES, upper, exact=False)


def exact_estimate(rows: int, tokens: int, per_token: int) -> Estimate:
    return Estimate(rows, tokens, per_token, tokens * per_token + rows * HEADER_BYTES, 0, exact=True)


def _existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return path


def check_disk(estimate: Estimate, present_bytes: int, directory: Path, limit: int | None) -> None:
    """Refuse when the whole output exceeds extract.max_disk_bytes (ConfigError), or when what is
    still to be written exceeds the free space of the output's filesystem (DiskSpaceError)."""
    if limit is not None and estimate.bytes > limit:
        raise ConfigError(f"extract.max_disk_bytes: the hidden states need {estimate.describe()}, but the limit is "
                          f"{fmt_bytes(limit)}; raise extract.max_disk_bytes, lower extract.seq_length, or use "
                          "fewer samples (datagen.max_samples)")
    needed = max(0, estimate.bytes - present_bytes)
    where = _existing_ancestor(directory)
    free = shutil.disk_usage(where).free
    if needed > free:
        raise DiskSpaceError(f"{directory}: the hidden states still need {fmt_bytes(needed)} "
                             f"(total {estimate.describe()}; {fmt_bytes(present_bytes)} already written) but the "
                             f"filesystem of {where} has only {fmt_bytes(free)} free; free space or move run_dir")
