"""The benchmark watch (eagle3/bench/watch.py) and the F4 gate (eagle3/bench/stats.py) on recorded
histories: tests/fixtures/bench-history/ holds two real results.json files of the bench phase, made
back to back by bench/record_bench_history.py on vLLM CPU (trained tiny drafter fixture, baseline +
k in {1, 3}, concurrency {1, 4}, 16 held-out prompts, 64 greedy tokens; see its README). The
variants below are those files with one thing changed, as a rerun after that change would record it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from eagle3.bench.stats import SLOWER_CAUSES, evaluate_gate
from eagle3.bench.watch import figures, read_history, watch

HISTORY = Path(__file__).resolve().parent / "fixtures" / "bench-history"


@pytest.fixture(scope="module")
def recorded() -> list[tuple[str, dict]]:
    runs = read_history(HISTORY)
    assert len(runs) == 2, f"expected two recorded runs in {HISTORY}"
    return runs


def as_gpu_run(results: dict) -> dict:
    """The same record judged as a GPU run's (speed is not judged on a CPU rehearsal)."""
    return {**copy.deepcopy(results), "cpu_rehearsal": False}


def scale_speed(results: dict, factor: float) -> dict:
    """The same run, `factor` times as fast: throughput x factor, every request's times / factor."""
    r = copy.deepcopy(results)
    for server in r["servers"]:
        for w in server["windows"]:
            load = w["load"]
            load["output_throughput"] *= factor
            load["mean_tpot_ms"] /= factor
            for q in load["requests"]:
                q["ttft_ms"] /= factor
                q["latency_ms"] /= factor
    return r


def scale_acceptance(results: dict, factor: float) -> dict:
    """The same run with every per-position acceptance rate x factor (counters and per-request chunks)."""
    r = copy.deepcopy(results)
    for server in r["servers"]:
        for w in server["windows"] if server["k"] else []:
            acc = w["acceptance"]
            acc["per_position"] = [p * factor for p in acc["per_position"]]
            acc["acceptance_length"] = 1 + sum(acc["per_position"])
            for q in w["load"]["requests"]:
                per_chunk = 1 + ((q["output_tokens"] - 1) / max(1, q["chunks"]) - 1) * factor
                q["chunks"] = max(1, round((q["output_tokens"] - 1) / per_chunk))
    return r


def test_every_figure_has_an_interval_around_its_value(recorded):
    for _, results in recorded:
        figs = figures(results)
        assert set(figs) == {"k0-c1", "k0-c4", "k1-c1", "k1-c4", "k3-c1", "k3-c4"}
        for f in figs.values():
            named = [f["output_tok_s"], f["mean_tpot_ms"]] + ([f["acceptance_length"], *f["per_position"]]
                                                              if f["k"] else [])
            for x in named:
                assert x["lo"] is not None and x["lo"] <= x["value"] <= x["hi"] and x["lo"] < x["hi"], (f, x)
                assert x["method"].startswith("bootstrap over 16 requests")


def test_a_stable_rerun_passes_with_intervals(recorded):
    (first_name, first), (_, second) = recorded
    w = watch(second, [(first_name, first)])
    assert w["status"] == "stable", w["message"]
    assert w["reference"]["file"] == first_name and w["changes"] == []
    # At two concurrencies: baseline tok/s + TPOT, k=1 those + length + 1 position, k=3 + 3 positions.
    assert len(w["comparisons"]) == 2 * 2 + 2 * 4 + 2 * 6
    assert all(r["lo"] is not None and r["reference_lo"] is not None for r in w["comparisons"])
    # Greedy decoding: the same acceptance on every rerun. Speed on the shared CPU box varies between
    # runs beyond one run's interval: reported, not judged, on a CPU rehearsal.
    for r in w["comparisons"]:
        if r["figure"] in ("output_tok_s", "mean_tpot_ms"):
            assert r["verdict"] == "within noise" or r["verdict"].endswith("(not judged: CPU rehearsal)")
        else:
            assert r["verdict"] == "within noise" and r["change_pct"] == 0.0, r
    print("\n".join(f"{r['where']} {r['figure']}: {r['reference']:.3f} -> {r['value']:.3f} ({r['change_pct']:+.1f} %, "
                    f"noise {r['noise']:.3f}) {r['verdict']}" for r in w["comparisons"]))


def test_a_drop_beyond_the_noise_after_an_engine_upgrade_is_a_regression_naming_it(recorded):
    (first_name, first), (_, second) = recorded
    upgraded = scale_acceptance(second, 0.3)
    upgraded["engine_version"] = "0.33.0"
    w = watch(upgraded, [(first_name, first)])
    assert w["status"] == "regression"
    assert f"engine version {first['engine_version']} -> 0.33.0" in w["changes"]
    assert "Changed since then: engine version" in w["message"] and "acceptance_length" in w["message"]
    bad = {(r["where"], r["figure"]) for r in w["comparisons"] if r["verdict"] == "regression"}
    assert ("k=3 c=1", "acceptance_length") in bad and ("k=1 c=4", "per_position[0]") in bad
    assert not any(r["where"].startswith("baseline") for r in w["comparisons"] if r["verdict"] == "regression")


def test_a_slowdown_beyond_the_noise_with_nothing_changed_says_so(recorded):
    (first_name, first), (_, second) = recorded
    w = watch(as_gpu_run(scale_speed(first, 0.6)), [(first_name, as_gpu_run(first))])
    assert w["status"] == "regression" and w["changes"] == []
    assert "nothing recorded changed" in w["message"] and "output_tok_s" in w["message"]


def test_a_drop_within_the_noise_passes_even_without_a_tolerance(recorded):
    (first_name, first), (_, second) = recorded
    slower = as_gpu_run(scale_speed(first, 0.97))  # 3 % slower: inside every throughput interval of the run
    w = watch(slower, [(first_name, as_gpu_run(first))], acceptance_tol_pct=0.0, speed_tol_pct=0.0)
    assert w["status"] == "stable", w["message"]
    tok_s = [r for r in w["comparisons"] if r["figure"] == "output_tok_s"]
    assert tok_s and all(r["change_pct"] == pytest.approx(-3.0, abs=0.01) and r["verdict"] == "within noise"
                         for r in tok_s)


def test_a_changed_drafter_is_a_new_baseline_and_the_next_run_compares_with_it(recorded):
    (first_name, first), (second_name, second) = recorded
    retrained = scale_acceptance(second, 0.5)
    retrained["drafter"] = {**retrained["drafter"], "checksum": "f" * 64}
    w = watch(retrained, [(first_name, first), (second_name, second)])
    assert w["status"] == "new baseline" and w["comparisons"] == []
    assert any(c.startswith("drafter checksum ") for c in w["changes"]) and "new baseline" in w["message"]
    retrained["watch"] = w
    again = watch(retrained, [(first_name, first), (second_name, second), ("3.json", retrained)])
    assert again["status"] == "stable" and again["reference"]["file"] == "3.json"
    assert all(r["change_pct"] == 0.0 for r in again["comparisons"])


def test_the_reference_is_the_last_good_run(recorded):
    (first_name, first), (_, second) = recorded
    bad = scale_acceptance(second, 0.3)
    bad["watch"] = watch(bad, [(first_name, first)])
    assert bad["watch"]["status"] == "regression"
    w = watch(second, [(first_name, first), ("2-bad.json", bad)])
    assert w["reference"]["file"] == first_name and w["status"] == "stable"


def test_the_spread_between_earlier_runs_widens_the_noise(recorded):
    """Two earlier good runs of the same setup: their spread joins the noise, so a change that one
    run's interval alone would call a regression is within the noise of what reruns vary by."""
    (first_name, first), (second_name, second) = recorded
    a, b = as_gpu_run(first), as_gpu_run(scale_speed(first, 0.7))  # earlier runs 30 % apart
    current = as_gpu_run(scale_speed(first, 0.55))
    alone = watch(current, [("b.json", b)], speed_tol_pct=0.0)
    assert any(r["verdict"] == "regression" and r["figure"] == "output_tok_s" for r in alone["comparisons"])
    with_spread = watch(current, [("a.json", a), ("b.json", b)], speed_tol_pct=0.0)
    assert with_spread["reference"]["file"] == "b.json"
    assert all(r["verdict"] == "within noise" for r in with_spread["comparisons"] if r["figure"] == "output_tok_s")


# ---- the F4 gate: every k slower than the baseline, first position rarely accepted ----------------

def _rejudge(results: dict, cpu_rehearsal: bool) -> dict:
    pooled = {int(k): v for k, v in results["acceptance_by_k"].items()}
    return evaluate_gate(pooled, True, 1.3, results["best_k"], cpu_rehearsal, first_position_floor=0.3)


def test_f4_symptom_fails_a_trained_drafter_on_gpus_and_is_reported_on_a_cpu_rehearsal(recorded):
    """The recorded runs show F4: on held-out prompts the tiny drafter's first position is accepted
    in 24-29 % of drafts, and no k is faster than the baseline at any concurrency."""
    _, results = recorded[1]
    assert all(not b["beats_baseline"] for b in results["best_k"].values())
    assert max(v["per_position"][0] for v in results["acceptance_by_k"].values()) < 0.3
    assert results["gate"]["best_acceptance_length"] > 1.3  # the old gate alone passed it
    gpu = _rejudge(results, cpu_rehearsal=False)
    assert gpu["status"] == "failed" and gpu["passed"] is False
    assert "no k is faster than the baseline at any measured concurrency" in gpu["message"]
    assert "draft position 0 is accepted in under 30 % of drafts" in gpu["message"]
    assert gpu["likely_causes"][: len(SLOWER_CAUSES)] == SLOWER_CAUSES
    cpu = _rejudge(results, cpu_rehearsal=True)
    assert cpu["status"] == "passed" and "Reported, not failed, on a CPU rehearsal" in cpu["message"]
    assert cpu["findings"] == gpu["findings"] and not cpu["likely_causes"]


def test_a_gpu_run_with_a_faster_k_and_good_first_position_passes():
    pooled = {1: {"acceptance_length": 1.8, "per_position": [0.8]}, 3: {"acceptance_length": 2.9,
                                                                        "per_position": [0.8, 0.6, 0.5]}}
    best = {"1": {"k": 3, "speedup": 1.9, "beats_baseline": True}, "64": {"k": 1, "speedup": 0.95,
                                                                          "beats_baseline": False}}
    gate = evaluate_gate(pooled, True, 1.3, best, cpu_rehearsal=False, first_position_floor=0.3)
    assert gate["status"] == "passed" and gate["findings"] == []


# ---- in the bench phase: a regression fails the run (GateError: the flow run ends Failed) -----------

def test_the_bench_phase_fails_on_a_regression_naming_the_change(recorded, tmp_path):
    """The phase re-judges saved server measurements (no server starts): the reference is the first
    recorded run, the saved measurements are the second with acceptance x 0.3 and a new engine version."""
    from eagle3.phases.bench import BenchPaths, _server_key, held_out_prompts, resolve_drafter, run_bench
    from eagle3.pipeline import supervisor
    from eagle3.errors import GateError
    from eagle3.fsio import atomic_write_json
    from tests.conftest import write_tiny_config

    fixture = Path(__file__).resolve().parent / "fixtures" / "eagle3-tiny"
    cfg = write_tiny_config(tmp_path, {"target": {"model": str(fixture / "target")}, "bench": {
        "drafter": str(fixture / "drafter-trained"), "drafter_trained": True, "acceptance_floor": 1.0,
        "num_speculative_tokens": [1, 3], "concurrency": [1, 4], "num_prompts": 16, "max_tokens": 64,
        "warmup_prompts": 2, "temperature": 0.0}}, check_files=False)  # bench/record_bench_history.py's settings
    (first_name, first), (_, second) = recorded
    paths = BenchPaths.of(cfg)
    reference = {**copy.deepcopy(first), "target": {**first["target"], "model": str(cfg.target.model)}}
    atomic_write_json(paths.history / first_name, reference)
    drafter, prompts = resolve_drafter(cfg), held_out_prompts(cfg)
    assert prompts["sha256"] == first["prompts"]["sha256"], "the recording's prompts"
    for run in scale_acceptance(second, 0.3)["servers"]:
        run["engine_version"] = "0.33.0"
        label = run["label"].replace("=", "")
        atomic_write_json(paths.servers / f"{label}.json",
                          {"key": _server_key(cfg, run["k"], drafter, prompts), "run": run})
    with pytest.raises(GateError) as err:
        run_bench(cfg, supervisor(cfg))
    text = str(err.value)
    assert text.startswith("benchmark regression: regression against the last good run " + first_name)
    assert f"engine version {first['engine_version']} -> 0.33.0" in text and "acceptance_length" in text
    assert "acceptance gate failed" not in text  # the gate passed (floor 1.0): the regression alone fails it
    assert err.value.summary.details["watch"] == "regression"
    results = json.loads(paths.results.read_text())
    assert results["watch"]["status"] == "regression" and results["gate"]["status"] == "passed"
    assert "**Compared with history** (regression)" in paths.report.read_text()
    assert len(list(paths.history.glob("*.json"))) == 2  # the failed run is in the history too
    trend = paths.trend.read_text()
    assert "| 2 |" in trend and "regression |" in trend and paths.trend_plot.read_bytes().startswith(b"\x89PNG")


def test_the_trend_of_the_recorded_history_is_the_one_in_the_readme(recorded):
    from eagle3.bench.trend import markdown, plot_png, trend_rows

    rows = trend_rows(recorded)
    assert [(r["run"], r["k"], r["watch"]) for r in rows] == [(1, 1, "first"), (1, 3, "first"), (2, 1, "stable"),
                                                              (2, 3, "stable")]
    readme = (Path(__file__).resolve().parents[1] / "docs" / "benchmark.md").read_text()
    table = [line for line in markdown(rows).splitlines() if line.startswith("|")]
    assert len(table) == 6 and all(line in readme for line in table)
    assert plot_png(rows).startswith(b"\x89PNG")
