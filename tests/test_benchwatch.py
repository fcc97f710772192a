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
from eagle3.bench.figures import figures
from eagle3.bench.watch import read_history, watch

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


def test_a_rerun_of_the_same_drafter_is_not_blamed_on_it(recorded):
    """The two recorded back-to-back runs: greedy, so every acceptance figure repeats to the last digit;
    absolute speed is not judged until the setup's between-run noise is known; and the k=3 speedup at
    4 requests that moved (one window a side, servers one by one, on the shared CPU box) with the
    acceptance held is the node's, not the drafter's: reported, never a regression."""
    (first_name, first), (_, second) = recorded
    w = watch(second, [(first_name, first)])
    assert w["status"] in ("stable", "node drift") and w["reference"]["file"] == first_name and w["changes"] == []
    assert not any(r["verdict"] == "regression" and r["kind"] == "drafter" and r["figure"] != "speedup"
                   for r in w["comparisons"])
    # Two concurrencies: baseline tok/s + TPOT; k=1 those + speedup + length + 1 position; k=3 + 3 positions.
    assert len(w["comparisons"]) == 2 * 2 + 2 * 5 + 2 * 7
    for r in w["comparisons"]:
        if r["kind"] == "absolute":
            assert r["verdict"] == "not judged: between-run noise not yet known (1 of 3 runs)", r
        elif r["figure"] != "speedup":
            assert r["verdict"] == "within noise" and r["change_pct"] == 0.0, r
    assert "not judged yet" in w["message"]
    print("\n".join(f"{r['where']} {r['figure']}: {r['reference']:.3f} -> {r['value']:.3f} ({r['change_pct']:+.1f} %) "
                    f"{r['verdict']}" for r in w["comparisons"]))


def test_the_node_slowing_every_server_alike_is_drift_named_with_the_baseline(recorded):
    """Issue 54's case: the baseline 8 % slower, the drafter's servers 10 %, the paired speedup within its
    noise and the acceptance unchanged: node drift, with the baseline's change, never the drafter."""
    (first_name, first), _ = recorded
    rerun = scale_speed(first, 0.92)
    for server in rerun["servers"]:
        if server["k"]:
            for w_ in server["windows"]:
                load = w_["load"]
                load["output_throughput"] *= 0.90 / 0.92
                for q in load["requests"]:
                    q["latency_ms"] *= 0.92 / 0.90
    w = watch(rerun, [(first_name, first)])
    assert w["status"] == "node drift", w["message"]
    assert "not the drafter" in w["message"] and "baseline c=1 output tok/s" in w["message"] and "-8.0 %" in w["message"]
    assert all(r["verdict"] == "within noise" for r in w["comparisons"] if r["kind"] == "drafter"
               and r["figure"] != "speedup")


def test_a_lower_acceptance_is_the_drafters_regression_whatever_else_changed(recorded):
    """Acceptance is the drafter's: a drop beyond the tolerance is decided on greedy reruns of the same
    prompts (their counters repeat), and the verdict names what changed, here the engine."""
    (first_name, first), (_, second) = recorded
    upgraded = scale_acceptance(second, 0.3)
    upgraded["engine_version"] = "0.33.0"
    w = watch(upgraded, [(first_name, first)])
    assert w["status"] == "drafter regression"
    assert f"engine version {first['engine_version']} -> 0.33.0" in w["changes"]
    assert "Changed since then: engine version" in w["message"] and "acceptance_length" in w["message"]
    bad = {(r["where"], r["figure"]) for r in w["comparisons"] if r["verdict"] == "regression"}
    assert ("k=3 c=1", "acceptance_length") in bad and ("k=1 c=4", "per_position[0]") in bad


def test_a_retrained_drafter_is_compared_and_a_worse_one_named(recorded):
    """A rerun is scheduled to catch a worse drafter: a new checksum is compared with the last good run,
    and 5 % less acceptance is decided in one rerun, naming the drafter."""
    (first_name, first), (second_name, second) = recorded
    retrained = scale_acceptance(second, 0.95)
    retrained["drafter"] = {**retrained["drafter"], "checksum": "f" * 64}
    w = watch(retrained, [(first_name, first), (second_name, second)])
    assert w["status"] == "drafter regression", w["message"]
    assert any(c.startswith("drafter checksum ") for c in w["changes"]) and "drafter checksum" in w["message"]
    same = {**copy.deepcopy(second), "drafter": {**second["drafter"], "checksum": "e" * 64}}
    again = watch(same, [(first_name, first), (second_name, second)])
    assert again["status"] in ("stable", "node drift") and any("drafter checksum" in c for c in again["changes"])


def test_within_the_tolerance_is_within_noise_and_more_windows_decide_undecided(recorded):
    (first_name, first), _ = recorded
    w = watch(scale_acceptance(first, 0.99), [(first_name, first)])
    assert w["status"] in ("stable", "node drift")  # 1 % less: within the 3 % tolerance
    assert all(r["verdict"] == "within noise" for r in w["comparisons"] if r["figure"].startswith("acceptance"))
    sampled = {**copy.deepcopy(first), "sampling": {**first["sampling"], "temperature": 0.7}}
    worse = {**scale_acceptance(first, 0.93), "sampling": sampled["sampling"]}
    w = watch(worse, [(first_name, sampled)])  # sampled, no reruns yet: each run's own (wide) interval
    assert w["status"] == "undecided" and "bench.windows" in w["message"]


def test_the_reference_is_the_last_good_run(recorded):
    (first_name, first), (_, second) = recorded
    bad = scale_acceptance(second, 0.3)
    bad["watch"] = watch(bad, [(first_name, first)])
    assert bad["watch"]["status"] == "drafter regression"
    w = watch(second, [(first_name, first), ("2-bad.json", bad)])
    assert w["reference"]["file"] == first_name and w["status"] != "drafter regression"


def _reruns(first: dict, factors: list[float], engine: str | None = None) -> list[tuple[str, dict]]:
    runs = []
    for i, f in enumerate(factors):
        r = scale_speed(first, f)
        r["created_at"] = f"2026-11-30T2{i}:00:00+00:00"
        if engine:
            r["engine_version"] = engine
        runs.append((f"{i}.json", r))
    return runs


def test_absolute_speed_is_judged_once_the_between_run_noise_is_known(recorded):
    """Three earlier runs 3 % apart: a run 20 % slower with nothing recorded changed is node drift; the same
    after an engine upgrade is an engine regression; 2 % slower is within the noise."""
    (_, first), _ = recorded
    earlier = _reruns(first, [1.0, 0.97, 1.03])
    assert watch(scale_speed(first, 0.98), earlier)["status"] in ("stable", "node drift")
    slow = scale_speed(first, 0.8)
    w = watch(slow, earlier)
    assert w["status"] == "node drift" and w["noise_runs"] == 3
    assert any(r["verdict"] == "regression" and r["kind"] == "absolute" for r in w["comparisons"])
    slow["engine_version"] = "0.33.0"
    w = watch(slow, earlier)
    assert w["status"] == "engine regression" and "engine version" in w["message"] and "acceptance held" in w["message"]


def test_a_rerun_from_a_moved_checkout_is_no_engine_change_and_a_changed_serving_config_is(recorded):
    """The whole config's hash holds paths; the watch compares what the bench asks of its engine
    (serving_hash, eagle3/bench/provenance.py), and an earlier result that lacks it is not compared on it."""
    (_, first), _ = recorded
    earlier = [(n, {**r, "serving_hash": "s1", "config_hash": "here"}) for n, r in _reruns(first, [1.0, 0.97, 1.03])]
    slow = {**scale_speed(first, 0.8), "serving_hash": "s1", "config_hash": "moved"}
    assert watch(slow, earlier)["status"] == "node drift"
    assert watch(slow, [(n, {k: v for k, v in r.items() if k != "serving_hash"}) for n, r in earlier])["status"] \
        == "node drift"
    w = watch({**slow, "serving_hash": "s2"}, earlier)
    assert w["status"] == "engine regression" and "serving config s1 -> s2" in w["message"]


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
    from eagle3.phase_runner import supervisor
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
    assert text.startswith("benchmark regression: drafter regression against the last good run " + first_name)
    assert f"engine version {first['engine_version']} -> 0.33.0" in text and "acceptance_length" in text
    assert "acceptance gate failed" not in text  # the gate passed (floor 1.0): the regression alone fails it
    assert err.value.summary.details["watch"] == "drafter regression"
    results = json.loads(paths.results.read_text())
    assert results["watch"]["status"] == "drafter regression" and results["gate"]["status"] == "passed"
    assert "**Compared with history** (drafter regression)" in paths.report.read_text()
    assert len(list(paths.history.glob("*.json"))) == 2  # the failed run is in the history too
    trend = paths.trend.read_text()
    assert "| 2 |" in trend and "drafter regression |" in trend


def test_the_trend_of_the_recorded_history_is_the_one_in_the_readme(recorded):
    from eagle3.bench.trend import markdown, trend_rows

    rows = trend_rows(recorded)
    assert [(r["run"], r["k"], r["watch"]) for r in rows] == [(1, 1, "first"), (1, 3, "first"), (2, 1, "stable"),
                                                              (2, 3, "stable")]
    readme = (Path(__file__).resolve().parents[1] / "docs" / "benchmark.md").read_text()
    table = [line for line in markdown(rows).splitlines() if line.startswith("|")]
    assert len(table) == 6 and all(line in readme for line in table)


def test_the_target_is_the_same_wherever_its_dir_lies_and_another_by_its_content(recorded, tmp_path):
    """2026-12-06's H100 rerun from another checkout path was a "new baseline" by the target's path alone."""
    from eagle3.bench.provenance import target_fingerprint

    a, b = tmp_path / "a" / "model", tmp_path / "b" / "model"
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "config.json").write_text('{"hidden_size": 8}')
        (d / "model.safetensors").write_bytes(bytes(range(256)) * 20_000)  # ~5 MiB: first and last MiB read
    assert target_fingerprint(a) == target_fingerprint(b) and target_fingerprint(tmp_path / "none") is None
    tuned = bytearray((b / "model.safetensors").read_bytes())
    tuned[100] ^= 1  # the same shapes, other weights
    (b / "model.safetensors").write_bytes(bytes(tuned))
    assert target_fingerprint(a) != target_fingerprint(b)

    (first_name, first), (_, second) = recorded
    here, moved = copy.deepcopy(first), copy.deepcopy(second)
    here["target"] |= {"model": str(a), "fingerprint": target_fingerprint(a)}
    moved["target"] |= {"model": "/elsewhere/model", "fingerprint": target_fingerprint(a)}
    assert watch(moved, [(first_name, here)])["status"] in ("stable", "node drift")
    moved["target"]["fingerprint"] = target_fingerprint(b)
    w = watch(moved, [(first_name, here)])
    assert w["status"] == "new baseline" and any(c.startswith("target ") for c in w["changes"])
