"""The bench phase's files (its phase dir and the run dir's bench-history/)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..config import PipelineConfig
from ..layout import BENCH_REPORT, BENCH_RESULTS

PHASE = "bench"


@dataclass(frozen=True)
class BenchPaths:
    dir: Path
    history: Path

    @classmethod
    def of(cls, cfg: PipelineConfig) -> "BenchPaths":
        return cls(cfg.phase_dir(PHASE), cfg.layout.bench_history)

    results = property(lambda self: self.dir / BENCH_RESULTS)
    report = property(lambda self: self.dir / BENCH_REPORT)
    trend = property(lambda self: self.dir / "trend.md")
    servers = property(lambda self: self.dir / "servers")
    clients = property(lambda self: self.dir / "clients")
    logs = property(lambda self: self.dir / "logs")


def slug(label: str) -> str:
    return label.replace("=", "")  # "k=3" -> "k3": file names and Prefect keys
