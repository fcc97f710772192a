"""Verdicts from repeated windows (eagle3/bench/repeats.py, stats.py, watch.py): one noisy window no longer
flips the gate, a real 20 % regression is caught, an undecided comparison says so, every engine path
gets intervals, and the A/A check of a run with two rounds."""

from __future__ import annotations

import json
import random

import pytest

from eagle3.bench.repeats import mean_interval, paired_ratio_interval, ratio_interval, rounds_agree, t975, verdict
from eagle3.bench.report import markdown
from eagle3.bench.stats import best_k, evaluate_gate, on_rerun, table
from eagle3.bench.figures import figures
from eagle3.bench.watch import watch
from eagle3.engines.metrics import SpecCounters, acceptance

DELTA3 = SpecCounters(100, 300, 170, (80, 55, 35))  # one window's counter delta: acceptance length 2.7
ACC3 = acceptance(DELTA3).to_dict()


def _window(c: int, tok_s: float, acc: dict | None = None, requests: bool = True) -> dict:
    load = {"output_throughput": tok_s, "mean_tpot_ms": 1000.0 / tok_s * c, "mean_ttft_ms": 10.0,
            "completed": 16, "failed": 0}
    if requests:  # vLLM's per-request data, consistent with the window's throughput
        load["requests"] = [{"output_tokens": 64, "ttft_ms": 10.0, "latency_ms": 64_000.0 / tok_s * c,
                             "chunks": 24 if acc else 63} for _ in range(16)]
    return {"concurrency": c, "load": load, "acceptance": acc, "delta": DELTA3.to_dict() if acc else None}


def _runs(base: list[float], spec: list[float], c: int = 1, rounds: int = 1) -> list[dict]:
    """Servers of `rounds` rounds (A B A B): each round's baseline and k=3 get their share of the windows."""
    per = len(base) // rounds
    runs = []
    for n in range(rounds):
        runs.append({"label": "baseline", "k": 0, "round": n + 1,
                     "windows": [_window(c, x) for x in base[n * per:(n + 1) * per]]})
        runs.append({"label": "k=3", "k": 3, "round": n + 1,
                     "windows": [_window(c, x, ACC3) for x in spec[n * per:(n + 1) * per]]})
    return runs


def _gate(runs: list[dict]) -> dict:
    rows = table(runs)
    return evaluate_gate({3: ACC3}, True, 1.3, best_k(rows), cpu_rehearsal=False, first_position_floor=0.3)


def test_t_quantiles_and_a_mean_interval():
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(30) == 2.042 and 1.96 < t975(1000) < 1.97
    m = mean_interval([10.0, 12.0, 14.0])
    assert m["value"] == 12.0 and m["lo"] == pytest.approx(12 - 4.303 * 2 / 3 ** 0.5) and m["n"] == 3
    assert mean_interval([10.0])["lo"] is None  # one window: no interval


def test_one_noisy_window_no_longer_flips_the_gate():
    """The H200 record: two identical runs gave 0.97x then 1.03x, and the gate flipped. With three
    windows a side, one window 20 % off moves the point but not the verdict, nor the gate."""
    base = [500.0, 505.0, 495.0]
    calm = _runs(base, [505.0, 498.0, 512.0])
    noisy = _runs(base, [505.0, 498.0, 400.0])  # one window hit by a hiccup: point 0.94x
    rows_calm, rows_noisy = table(calm), table(noisy)
    assert rows_noisy[1]["speedup"] < 1 < rows_calm[1]["speedup"]  # the points straddle 1, as on the H200
    assert rows_calm[1]["verdict"] == rows_noisy[1]["verdict"] == "undecided"
    g_calm, g_noisy = _gate(calm), _gate(noisy)
    assert g_calm["status"] == g_noisy["status"] == "passed" and g_calm["findings"] == g_noisy["findings"] == []
    assert g_noisy["speed"].startswith("speed undecided") and "reported, not failed" in g_noisy["message"]
    # The same single window alone decides nothing either: it neither passes nor fails the speed gate.
    one = _runs([500.0], [400.0])
    assert table(one)[1]["verdict"] == "undecided" and _gate(one)["status"] == "passed"


def test_a_decided_slowdown_fails_and_a_decided_speedup_passes_the_gate():
    slower = _gate(_runs([500.0, 503.0, 497.0], [400.0, 404.0, 398.0]))
    assert slower["status"] == "failed" and "no k is faster than the baseline" in slower["message"]
    assert "[0.7" in slower["message"] or "[0.8" in slower["message"]  # the interval is named
    faster = _gate(_runs([500.0, 503.0, 497.0], [650.0, 655.0, 648.0]))
    assert faster["status"] == "passed" and faster["speed"] is None and faster["findings"] == []


def test_a_rerun_of_a_held_drafter_reports_the_gates_speed_finding_and_fails_nothing():
    """The H100 case of 2026-12-06: the shipped SmolLM2 drafter decided slower (0.92x) on a rerun, its
    acceptance the same to the last digit: the node's to explain, which the watch judges."""
    slower = _gate(_runs([500.0, 503.0, 497.0], [460.0, 462.0, 458.0]))
    held = {"status": "node drift", "reference": {"file": "20261206T112600Z.json"}, "changes": []}
    rerun = on_rerun(slower, held)
    assert slower["status"] == "failed" and rerun["status"] == "passed" and rerun["passed"] is True
    assert "no k is faster" in rerun["message"] and "Reported, not failed" in rerun["message"]
    assert "20261206T112600Z.json" in rerun["message"] and rerun["likely_causes"] == []
    # The gate's own: a drafter's first judgment, a changed drafter, a regressed one, and the acceptance floor.
    for watch in (None, {"status": "first", "reference": None, "changes": []},
                  {"status": "new baseline", "reference": {"file": "x"}, "changes": ["target /a -> /b"]},
                  {"status": "stable", "reference": {"file": "x"}, "changes": ["drafter checksum ab -> cd"]},
                  {"status": "drafter regression", "reference": {"file": "x"}, "changes": []}):
        assert on_rerun(slower, watch)["status"] == "failed", watch
    floor = evaluate_gate({3: acceptance(SpecCounters(100, 300, 10, (6, 3, 1))).to_dict()}, True, 1.3,
                          best_k(table(_runs([500.0, 503.0, 497.0], [460.0, 462.0, 458.0]))), first_position_floor=0.3)
    assert floor["status"] == "failed" and on_rerun(floor, held)["status"] == "failed"


def test_an_undecided_comparison_is_reported_as_undecided_with_the_windows_it_would_take():
    runs = _runs([500.0, 540.0, 470.0], [520.0, 500.0, 545.0])
    [_, row] = table(runs)
    assert row["verdict"] == "undecided" and row["speedup_ci"][0] < 1 < row["speedup_ci"][1]
    assert row["more_windows"] >= 1 and f"about {row['more_windows']} more window(s)" in row["verdict_why"]
    results = {"pipeline": "p", "created_at": "2026-12-04T00:00:00+00:00", "config_hash": "c", "bench_config_hash": "b",
               "engine": "vllm", "engine_version": "0.25.0", "bench_client": "vllm bench serve", "acceptance_source": "x",
               "target": {"model": "/m", "served_name": "m"},
               "drafter": {"path": "/d", "trained": True, "source": "s", "aux_layer_ids": [2, 15, 27]},
               "prompts": {"count": 16, "path": "/p", "selection": "held out"},
               "sampling": {"temperature": 0.0, "max_tokens": 64, "ignore_eos": False, "warmup_prompts": 2},
               "table": table(runs), "best_k": best_k(table(runs)), "gate": _gate(runs), "windows": 3, "rounds": 1}
    md = markdown(results)
    assert "| undecided |" in md and "— undecided: 95 % interval [" in md and "more window(s) per side" in md


def _results(runs: list[dict], engine: str = "vllm") -> dict:
    return {"servers": runs, "engine": engine, "cpu_rehearsal": False, "created_at": "2026-12-04T00:00:00+00:00",
            "target": {"model": "/m"}, "drafter": {"path": "/d", "checksum": "abc"}, "prompts": {"sha256": "p"},
            "sampling": {"temperature": 0.0}, "engine_version": "0.25.0"}


def _noisy(mean: float, n: int, rng: random.Random, sd: float = 0.02) -> list[float]:
    return [mean * (1 + rng.gauss(0, sd)) for _ in range(n)]


def test_a_real_20_percent_slower_speedup_is_caught_and_an_a_a_rerun_is_not():
    """The paired speedup 20 % lower beyond its noise: a new drafter's regression; the same drafter's with
    its acceptance held is a slower step (the node's, or the engine's when it changed); an A/A rerun is stable."""
    rng = random.Random(7)
    reference = _results(_runs(_noisy(500, 3, rng), _noisy(600, 3, rng)))
    rerun = _results(_runs(_noisy(500, 3, rng), _noisy(600, 3, rng)))  # the same setup again (A/A)
    regressed = _results(_runs(_noisy(500, 3, rng), _noisy(480, 3, rng)))  # the drafter's server 20 % slower
    assert watch(rerun, [("ref.json", reference)], speed_tol_pct=10.0)["status"] == "stable"
    w = watch(regressed, [("ref.json", reference)], speed_tol_pct=10.0)
    assert w["status"] == "node drift" and "k=3 c=1 speedup" in w["message"] and "not the drafter" in w["message"]
    w = watch({**regressed, "engine_version": "0.26.0"}, [("ref.json", reference)], speed_tol_pct=10.0)
    assert w["status"] == "engine regression" and "engine version 0.25.0 -> 0.26.0" in w["message"]
    w = watch({**regressed, "drafter": {"path": "/d", "checksum": "new"}}, [("ref.json", reference)], speed_tol_pct=10.0)
    assert w["status"] == "drafter regression" and "k=3 c=1 speedup" in w["message"]
    assert "drafter checksum abc -> new" in w["message"]


def test_every_engine_path_yields_intervals():
    """vLLM 0.32 and 0.25 (per-request data: tests/engines/test_load_results.py) and SGLang (no per-request
    data): with repeated windows every speed figure has an interval from the windows themselves."""
    sglang = [{"label": "baseline", "k": 0, "windows": [_window(1, x, requests=False) for x in (500, 510, 490)]},
              {"label": "k=3", "k": 3, "windows": [_window(1, x, ACC3, requests=False) for x in (600, 590, 615)]}]
    figs = figures(_results(sglang, engine="sglang"))
    for key in ("k0-c1", "k3-c1"):
        for name in ("output_tok_s", "mean_tpot_ms"):
            f = figs[key][name]
            assert f["lo"] < f["value"] < f["hi"] and f["method"] == "t interval over 3 windows", (key, name, f)
    assert figs["k3-c1"]["acceptance_length"]["value"] == pytest.approx(ACC3["acceptance_length"])
    assert table(sglang)[1]["speedup_ci"] is not None and table(sglang)[1]["verdict"] == "faster"
    one = figures(_results([{"label": "baseline", "k": 0, "windows": [_window(1, 500.0)]}]))
    assert one["k0-c1"]["output_tok_s"]["method"] == "bootstrap over 16 requests"  # one window: its requests


def test_two_rounds_pool_their_windows_and_check_each_other():
    rng = random.Random(3)
    same = _runs(_noisy(500, 4, rng), _noisy(600, 4, rng), rounds=2)
    row = table(same)[1]
    assert row["windows"] == 4 and row["verdict"] == "faster"
    aa = rounds_agree(same)
    assert aa["status"] == "agree" and len(aa["rows"]) == 2 and all(r["agrees"] for r in aa["rows"])
    widest = max(max(r["ci"][1] / r["ratio"] - 1, 1 - r["ci"][0] / r["ratio"]) for r in aa["rows"]) * 100  # half-width
    assert aa["resolution_pct"] == pytest.approx(widest, abs=0.1) and f"±{widest:.0f} %" in aa["message"]


def test_an_agreeing_aa_check_says_how_coarse_it_is():
    """The H200's A/A of 2026-12-04 (baseline c=1, two windows a round): it agrees, and says that only a
    change beyond ±64 % would have shown; the same spread over eight windows a round is ~4 times sharper."""
    h200 = _runs([491.1, 446.4, 425.2, 433.4], [386.7, 358.1, 367.2, 381.6], rounds=2)
    coarse = rounds_agree(h200)
    assert coarse["status"] == "agree" and coarse["resolution_pct"] > 50
    rng = random.Random(5)
    sharp = rounds_agree(_runs(_noisy(450, 16, rng, sd=0.03), _noisy(375, 16, rng, sd=0.03), rounds=2))
    assert sharp["status"] == "agree" and sharp["resolution_pct"] < 10
    drifted = _runs([500, 505, 400, 402], [600, 604, 480, 484], rounds=2)  # the whole node 20 % slower in round 2
    moved = rounds_agree(drifted)
    assert moved["status"] == "differ" and "baseline c=1 round 2: 0.79" in moved["message"]
    assert table(drifted)[1]["speedup"] == pytest.approx(1.2, abs=0.01)  # the A B A B ratio survives the drift


def test_verdict_edges():
    assert verdict(ratio_interval([10.0, 10.0], [10.0, 10.0]))["verdict"] == "undecided"
    assert verdict(ratio_interval([12.0, 12.1], [10.0, 10.1]))["verdict"] == "faster"
    assert verdict({"value": None})["why"] == "nothing measured"
    json.dumps(verdict(ratio_interval([1.0, 2.0, 3.0], [2.0, 2.0, 2.1])))  # JSON-ready


def test_the_bench_phase_runs_rounds_in_a_b_a_b_order_and_reports_the_a_a_check(tmp_path):
    """run_bench with bench.rounds 2 and bench.windows 2, from saved server measurements (no server
    starts): four servers in A B A B order, each point pooled over both rounds, the A/A check reported."""
    from pathlib import Path

    from eagle3.bench.paths import slug
    from eagle3.fsio import atomic_write_json
    from eagle3.phases.bench import BenchPaths, _label, _server_key, held_out_prompts, resolve_drafter, run_bench
    from eagle3.phase_runner import supervisor
    from tests.conftest import write_tiny_config

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "eagle3-tiny"
    cfg = write_tiny_config(tmp_path, {"target": {"model": str(fixture / "target")}, "bench": {
        "drafter": str(fixture / "drafter-trained"), "drafter_trained": True, "acceptance_floor": 1.0,
        "num_speculative_tokens": [3], "concurrency": [1], "windows": 2, "rounds": 2, "num_prompts": 16,
        "max_tokens": 64, "warmup_prompts": 2, "parity": {"enabled": False}}}, check_files=False)
    assert [_label(k, n) for n in (1, 2) for k in (0, 3)] == ["baseline", "k=3", "baseline (round 2)",
                                                               "k=3 (round 2)"]
    paths = BenchPaths.of(cfg)
    drafter, prompts = resolve_drafter(cfg), held_out_prompts(cfg)
    rng = random.Random(11)
    for n in (1, 2):
        for k, mean in ((0, 500.0), (3, 650.0)):
            run = {"label": _label(k, n), "k": k, "round": n, "engine_version": "0.32.0", "probes": [],
                   "windows": [{**_window(1, x, ACC3 if k else None), "repeat": i + 1}
                               for i, x in enumerate(_noisy(mean, 2, rng))]}
            atomic_write_json(paths.servers / f"{slug(_label(k, n))}.json",
                              {"key": _server_key(cfg, k, drafter, prompts), "run": run})
    summary = run_bench(cfg, supervisor(cfg))
    results = json.loads(paths.results.read_text())
    assert [s["label"] for s in results["servers"]] == ["baseline", "k=3", "baseline (round 2)", "k=3 (round 2)"]
    [base, k3] = results["table"]
    assert base["windows"] == k3["windows"] == 4 and k3["verdict"] == "faster" and k3["speedup_ci"][0] > 1
    assert results["aa"]["status"] == "agree" and results["windows"] == 2 and results["rounds"] == 2
    assert summary.details["best_k"]["1"]["beats_baseline"] is True
    report = paths.report.read_text()
    assert "**A/A check** (agree)" in report and "2 window(s) per server and concurrency, 2 round(s)" in report


def test_the_step_cost_arithmetic_of_the_h200_record():
    """The operator's H200 run of the real model: baseline TPOT 1.87 ms, k=3 TPOT 1.75 ms at acceptance
    length 2.38: a step costs 2.38 x 1.75 / 1.87 = 2.23 plain steps, so 1.3x needs a length of 2.90."""
    acc = acceptance(SpecCounters(100, 300, 138, (64, 43, 31))).to_dict()
    base = {"concurrency": 1, "load": {"output_throughput": 534.8, "mean_tpot_ms": 1.87, "completed": 64,
                                       "failed": 0}, "acceptance": None}
    spec = {"concurrency": 1, "load": {"output_throughput": 571.4, "mean_tpot_ms": 1.75, "completed": 64,
                                       "failed": 0}, "acceptance": acc}
    [_, row] = table([{"label": "baseline", "k": 0, "windows": [base]}, {"label": "k=3", "k": 3, "windows": [spec]}])
    assert row["step_cost"] == pytest.approx(2.227, abs=1e-3) and row["length_needed"] == pytest.approx(2.896, abs=1e-3)
    results = {"pipeline": "p", "created_at": "t", "config_hash": "c", "bench_config_hash": "b", "engine": "vllm",
               "engine_version": "0.25.0", "bench_client": "x", "acceptance_source": "x",
               "target": {"model": "/m", "served_name": "m"}, "drafter": {"path": "/d", "trained": True, "source": "s"},
               "prompts": {"count": 64, "path": "/p", "selection": "held out"},
               "sampling": {"temperature": 0.0, "max_tokens": 128, "ignore_eos": False, "warmup_prompts": 4},
               "table": [row], "best_k": {}, "gate": {"status": "passed", "message": "m", "likely_causes": []}}
    assert ("k=3, concurrency 1: a step costs 2.23 plain steps; 1.3× needs acceptance length 2.90 (measured 2.38, "
            "at most 4)") in markdown(results)


def test_paired_slots_decide_what_drift_leaves_undecided_for_unpaired_windows():
    """bench.schedule interleaved: each window slot holds a baseline and a k window back to back. With
    drift across slots (the H200's windows moved 4-10 %), the unpaired Welch interval of a true 5 %
    speedup straddles 1; paired slot by slot, the common drift cancels and it is decided faster. The
    same windows without slots fall back to Welch, and an A/A pair of the same config stays undecided."""
    drift = [400.0, 470.0, 430.0, 500.0, 445.0]
    rng = random.Random(7)
    base = [_window(1, x) for x in drift]
    spec = [_window(1, x * 1.05 * (1 + rng.uniform(-0.005, 0.005)), ACC3) for x in drift]
    unpaired = table([{"label": "baseline", "k": 0, "windows": base}, {"label": "k=3", "k": 3, "windows": spec}])[1]
    assert unpaired["verdict"] == "undecided" and unpaired["speedup_method"] == "Welch over 5/5 windows"
    slot = lambda ws: [{**w, "slot": f"r1w{i + 1}"} for i, w in enumerate(ws)]  # noqa: E731
    paired = table([{"label": "baseline", "k": 0, "windows": slot(base)},
                    {"label": "k=3", "k": 3, "windows": slot(spec)}])[1]
    assert paired["verdict"] == "faster" and paired["speedup_method"] == "paired over 5 window slots"
    assert 1.04 < paired["speedup_ci"][0] < paired["speedup"] < paired["speedup_ci"][1] < 1.06
    same = paired_ratio_interval([(x * (1 + rng.uniform(-0.01, 0.01)), x) for x in drift])
    assert verdict(same)["verdict"] == "undecided" and same["lo"] < 1 < same["hi"]
    assert paired_ratio_interval([(500.0, 400.0)])["lo"] is None  # one slot: no spread to judge by


def test_the_baseline_twin_is_an_a_a_check_in_every_interleaved_run(tmp_path):
    """run_bench with schedule interleaved and aa_twin, from saved server measurements (no server starts):
    the twin is measured in every slot but is no point of the table; its paired ratio to the baseline
    agrees and gives the noise floor; a twin that is consistently 5 % off is reported as differing."""
    from pathlib import Path

    from eagle3.bench.paths import slug
    from eagle3.bench.repeats import twin_agrees
    from eagle3.fsio import atomic_write_json
    from eagle3.phases.bench import BenchPaths, _label, _server_key, held_out_prompts, resolve_drafter, run_bench
    from eagle3.phase_runner import supervisor
    from tests.conftest import write_tiny_config

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "eagle3-tiny"
    cfg = write_tiny_config(tmp_path, {"target": {"model": str(fixture / "target")}, "bench": {
        "drafter": str(fixture / "drafter-trained"), "drafter_trained": True, "acceptance_floor": 1.0,
        "num_speculative_tokens": [3], "concurrency": [1], "windows": 4, "schedule": "interleaved",
        "aa_twin": True, "num_prompts": 16, "max_tokens": 64, "warmup_prompts": 2, "parity": {"enabled": False}}},
        check_files=False)
    paths = BenchPaths.of(cfg)
    drafter, prompts = resolve_drafter(cfg), held_out_prompts(cfg)
    drift, rng = [420.0, 480.0, 440.0, 505.0], random.Random(5)
    servers = (("baseline", 0, False, 1.0), ("k=3", 3, False, 1.3), ("baseline (twin)", 0, True, 1.0))
    for label, k, twin, gain in servers:
        assert _label(k, 1, twin) == label
        windows = [{**_window(1, x * gain * (1 + rng.uniform(-0.004, 0.004)), ACC3 if k else None),
                    "repeat": i + 1, "slot": f"r1w{i + 1}"} for i, x in enumerate(drift)]
        run = {"label": label, "k": k, "round": 1, "engine_version": "0.32.0", "probes": [], "windows": windows,
               **({"twin": True} if twin else {})}
        atomic_write_json(paths.servers / f"{slug(label)}.json",
                          {"key": _server_key(cfg, k, drafter, prompts), "run": run})
    run_bench(cfg, supervisor(cfg))
    results = json.loads(paths.results.read_text())
    assert [s["label"] for s in results["servers"]] == ["baseline", "k=3", "baseline (twin)"]
    [base, k3] = results["table"]  # the twin is no point of its own
    assert base["windows"] == k3["windows"] == 4 and k3["verdict"] == "faster"
    assert k3["speedup_method"] == "paired over 4 window slots"
    twin = results["aa_twin"]
    assert twin["status"] == "agree" and 0 < twin["noise_floor_pct"] < 2 and twin["rows"][0]["slots"] == 4
    assert "**A/A check, the baseline's twin** (agree)" in paths.report.read_text()
    off = [{**r, "windows": [{**w, "load": {**w["load"], "output_throughput": w["load"]["output_throughput"] * 0.95}}
                             for w in r["windows"]]} if r.get("twin") else r for r in results["servers"]]
    assert twin_agrees(off)["status"] == "differ"
