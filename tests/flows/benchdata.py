"""Synthetic benchmark measurements (three servers, two concurrencies) and the results document
the bench phase would assemble from them: for the report and artifact tests, and for the stand-in
bench phase of noop_phases.py (knob "bench_report")."""

from __future__ import annotations

from eagle3.bench.stats import best_k, evaluate_gate, table
from eagle3.engines.metrics import SpecCounters, acceptance


def _load(tok_s: float, tpot: float) -> dict:
    return {"output_throughput": tok_s, "mean_tpot_ms": tpot, "mean_ttft_ms": 10.0, "completed": 8, "failed": 0}


def synthetic_runs() -> list[dict]:
    def window(c, tok_s, tpot, acc=None):
        return {"concurrency": c, "load": _load(tok_s, tpot), "acceptance": acc}

    a1 = acceptance(SpecCounters(10, 10, 6, (6,))).to_dict()
    a3 = acceptance(SpecCounters(10, 30, 12, (6, 4, 2))).to_dict()
    return [{"label": "baseline", "k": 0, "windows": [window(1, 100, 10), window(4, 300, 13)]},
            {"label": "k=1", "k": 1, "windows": [window(1, 150, 7, a1), window(4, 330, 12, a1)]},
            {"label": "k=3", "k": 3, "windows": [window(1, 180, 6, a3), window(4, 270, 15, a3)]}]


def synthetic_results(pipeline: str = "t", trained: bool = False, floor: float = 1.3) -> dict:
    """`trained` with a floor above the best acceptance length (2.2) makes the gate fail: a regression."""
    runs = synthetic_runs()
    rows = table(runs)
    return {"pipeline": pipeline, "created_at": "2026-01-01T00:00:00+00:00", "config_hash": "c",
            "bench_config_hash": "b", "engine": "vllm", "engine_version": "0.32.0", "bench_client": "vllm bench serve",
            "acceptance_source": "x", "target": {"model": "/m", "served_name": "m"},
            "drafter": {"path": "/d", "trained": trained, "source": "s", "aux_layer_ids": [2, 4, 5]},
            "prompts": {"count": 8, "path": "/p", "selection": "held out"},
            "sampling": {"temperature": 0.0, "max_tokens": 32, "ignore_eos": False, "warmup_prompts": 2},
            "table": rows, "best_k": best_k(rows),
            "acceptance_by_k": {"1": runs[1]["windows"][0]["acceptance"], "3": runs[2]["windows"][0]["acceptance"]},
            "gate": evaluate_gate({3: {"acceptance_length": 2.2}}, trained=trained, floor=floor), "notes": ["a note"]}
