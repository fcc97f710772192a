"""Phase 4 (speculative-decoding benchmark).

Fast tests: prompt hold-out, the results table, speedups, best k, the gate, the report,
the load generator's command line. Slow tests run the phase against real vLLM CPU servers and the
real `vllm bench serve`, and check every acceptance number against the server's own counters:
  - the whole phase on the constant tiny target with the constant drafter (docs/FACTS.md §5),
    baseline + k in {1, 3}, concurrency {1, 4}: 100 % acceptance and length exactly k + 1
    (3 servers); then the gate, re-judged on the saved measurements (no server);
  - an untrained (random) drafter: acceptance near 0 (1 server);
  - the trained tiny drafter fixture (tests/fixtures/eagle3-tiny, trained on a GPU for the fixture
    target), if present: acceptance above the untrained one's on the same target (1 server).
Run with --basetemp on a shared machine: the phase runs for minutes, and other pytest sessions
prune old directories under the default base temp.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from eagle3.progress import counts, subscribed
from eagle3.bench.stats import LIKELY_CAUSES, best_k, evaluate_gate, gate_error_text, table
from eagle3.engines import loadgen
from eagle3.engines.metrics import SpecCounters, acceptance
from eagle3 import engine_registry
from eagle3.errors import ConfigError, GateError
from eagle3.phases.bench import BenchPaths, held_out_prompts, run_bench
from eagle3.bench.report import markdown
from tests.flows.benchdata import synthetic_results as _results, synthetic_runs as _runs

REPO = Path(__file__).resolve().parents[2]
# The trained tiny drafter of the training issue (made on a GPU) and the target it was trained for.
FIXTURES = REPO / "tests" / "fixtures" / "eagle3-tiny"
TRAINED_FIXTURE = Path(os.environ.get("EAGLE3_TRAINED_DRAFTER_FIXTURE", FIXTURES / "drafter-trained"))
FIXTURE_TARGET = FIXTURES / "target"


# ---- no server needed --------------------------------------------------------------------------

def _prompt_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def test_held_out_prompts_exclude_what_datagen_used(make_config, tmp_path):
    cfg = make_config({"datagen": {"prompts": str(_prompt_file(tmp_path / "p.jsonl", 10)), "max_samples": 6},
                       "bench": {"num_prompts": 3, "warmup_prompts": 1}}, check_files=False)
    samples = cfg.phase_dir("datagen") / "samples.jsonl"
    samples.parent.mkdir(parents=True)
    # Phase 1 finished p0..p4 and p7; a torn last row must not break (nor be "repaired" by) the bench.
    samples.write_text("".join(json.dumps({"id": f"p{i}"}) + "\n" for i in (0, 1, 2, 3, 4, 7)) + '{"id": "p9')
    before = samples.read_bytes()
    got = held_out_prompts(cfg)
    assert got["ids"] == ["p5", "p6", "p8"] and got["texts"] == ["question 5", "question 6", "question 8"]
    assert got["warmup_texts"] == ["question 9"]  # not among the measured prompts
    assert samples.read_bytes() == before


def test_held_out_prompts_without_datagen_output_skip_its_share(make_config, tmp_path):
    cfg = make_config({"datagen": {"prompts": str(_prompt_file(tmp_path / "p.jsonl", 5)), "max_samples": 3},
                       "bench": {"num_prompts": 8}}, check_files=False)
    got = held_out_prompts(cfg)
    assert got["ids"] == ["p3", "p4"] and got["count"] == 2 and got["requested"] == 8


def test_no_held_out_prompt_is_a_config_error(make_config, tmp_path):
    cfg = make_config({"datagen": {"prompts": str(_prompt_file(tmp_path / "p.jsonl", 4)), "max_samples": None}},
                      check_files=False)
    with pytest.raises(ConfigError, match="no held-out prompts.*bench.prompts"):
        held_out_prompts(cfg)


def test_bench_prompts_override(make_config, tmp_path):
    # No target files needed (check_files=False): under `make test`'s workers this may run before any
    # test has built the tiny model.
    cfg = make_config({"target": {"model": str(tmp_path / "no-model")},
                       "bench": {"prompts": str(_prompt_file(tmp_path / "mt.jsonl", 3)), "num_prompts": 2}},
                      check_files=False)
    assert held_out_prompts(cfg)["texts"] == ["question 0", "question 1"]


def test_table_speedups_and_best_k():
    rows = table(_runs())
    by = {(r["config"], r["concurrency"]): r for r in rows}
    assert by[("baseline", 1)]["speedup"] is None and by[("baseline", 1)]["acceptance_length"] is None
    assert by[("k=3", 1)]["speedup"] == 1.8 and by[("k=3", 1)]["tpot_speedup"] == pytest.approx(1.667, abs=1e-3)
    assert by[("k=3", 1)]["acceptance_rate_pct"] == 40.0 and by[("k=3", 1)]["acceptance_length"] == 2.2
    assert by[("k=3", 1)]["per_position_pct"] == [60.0, 40.0, 20.0]
    assert by[("k=1", 4)]["speedup"] == 1.1 and by[("k=3", 4)]["speedup"] == 0.9
    # One window per point: no spread to judge by, so nothing is decided however large the point speedup.
    assert all(r["verdict"] == "undecided" and r["speedup_ci"] is None for r in rows if r["k"])
    assert best_k(rows) == {
        "1": {"k": 3, "speedup": 1.8, "speedup_ci": None, "output_tok_s": 180.0, "verdict": "undecided",
              "beats_baseline": False},
        "4": {"k": 1, "speedup": 1.1, "speedup_ci": None, "output_tok_s": 330.0, "verdict": "undecided",
              "beats_baseline": False}}


def test_gate_fails_a_trained_drafter_below_the_floor_with_the_causes():
    gate = evaluate_gate({1: {"acceptance_length": 1.05}, 3: {"acceptance_length": 1.12}}, trained=True, floor=1.3)
    assert gate["status"] == "failed" and gate["passed"] is False and gate["best_acceptance_length"] == 1.12
    text = gate_error_text(gate, "/x/results.json")
    for cause in ("weights dropped at load", "wrong aux layers", "wrong algorithm flag", "chat template mismatch"):
        assert cause in text
    assert "/x/results.json" in text and gate["likely_causes"] == LIKELY_CAUSES


def test_gate_judges_the_best_k():
    gate = evaluate_gate({1: {"acceptance_length": 1.25}, 3: {"acceptance_length": 1.9}}, trained=True, floor=1.3)
    assert gate["status"] == "passed" and gate["passed"] is True and not gate["likely_causes"]


def test_gate_reports_an_untrained_drafter_instead_of_failing():
    gate = evaluate_gate({3: {"acceptance_length": 1.0}}, trained=False, floor=1.3)
    assert gate["status"] == "reported" and gate["passed"] is None and "UNTRAINED" in gate["message"]


def test_gate_without_any_acceptance_fails_a_trained_drafter():
    gate = evaluate_gate({3: None}, trained=True, floor=1.3)
    assert gate["status"] == "failed" and "not used" in gate["message"]


def test_report_markdown():
    results = _results()
    md = markdown(results)
    assert "| k=3 | 1 | 180.0 | 1.80× |" in md
    assert "- concurrency 1: k=3 (1.80×)" in md and "- concurrency 4: k=1 (1.10×)" in md
    assert "UNTRAINED rehearsal" in md and "![" not in md  # no plot: it would show the speedups without intervals


def test_foreign_traffic_is_detected_from_the_servers_counts():
    from eagle3.engines.metrics import Traffic
    from eagle3.bench.measure import foreign_traffic

    load = loadgen.LoadResult(8, 0, 1.0, 100, 256, 8.0, 256.0, *([None] * 8), None, "r.json")
    assert foreign_traffic(load, Traffic(8, 100, 256)) is None
    assert "finished 9 requests" in foreign_traffic(load, Traffic(9, 120, 288))
    assert "generated 300 tokens" in foreign_traffic(load, Traffic(8, 100, 300))


def test_vllm_client_window_holds_only_measured_requests(tmp_path):
    from eagle3.config import EngineEnv

    spec = loadgen.LoadSpec("http://127.0.0.1:1", "served", Path("/m"), tmp_path / "d.jsonl", 8, 4, 32, 0.0,
                                False, tmp_path / "r.json")
    argv = engine_registry.get("vllm").load_argv(EngineEnv(python=Path("/venv/bin/python")), spec)
    assert argv[:3] == ["/venv/bin/vllm", "bench", "serve"]
    opts = dict(zip(argv[3::1], argv[4::1]))
    # No ready-check request and no client warm-up: they would fall inside the counter window.
    assert opts["--num-warmups"] == "0" and opts["--ready-check-timeout-sec"] == "0"
    assert opts["--backend"] == "openai-chat" and opts["--dataset-name"] == "custom"
    assert opts["--served-model-name"] == "served" and opts["--max-concurrency"] == "4"
    assert opts["--custom-output-len"] == "32" and opts["--temperature"] == "0.0"
    assert "--skip-chat-template" in argv and "--ignore-eos" not in argv


# ---- real servers ------------------------------------------------------------------------------

slow = [pytest.mark.slow, pytest.mark.engine]


@pytest.fixture(scope="module")
def constant_drafter(tiny_constant_model):
    from eagle3.drafters.testmaker import DrafterSpec, ensure_drafter
    from eagle3.tinymodel import default_engine

    return ensure_drafter(REPO / "models" / "tiny-drafter-constant", tiny_constant_model, default_engine(),
                          DrafterSpec(constant=True))


@pytest.fixture(scope="module")
def comparison_target(tiny_model) -> Path:
    """The target the trained fixture drafter was trained for (the ordinary tiny model if the
    fixture target is absent): untrained and trained drafters are measured on the same target."""
    return FIXTURE_TARGET if (FIXTURE_TARGET / "config.json").is_file() else tiny_model


@pytest.fixture(scope="module")
def random_drafter(comparison_target):
    from eagle3.drafters.testmaker import DrafterSpec, ensure_drafter
    from eagle3.tinymodel import default_engine

    name = "tiny-drafter-random-fixture" if comparison_target == FIXTURE_TARGET else "tiny-drafter-random"
    return ensure_drafter(REPO / "models" / name, comparison_target, default_engine(), DrafterSpec())


def _bench_config(tmp_path, target: Path, drafter: Path, trained: bool, ks, concurrency, **bench):
    from tests.conftest import write_tiny_config
    from tests.ports import free_port

    overrides = {"target": {"model": str(target)},
                 "bench": {"server": {"port": free_port()}, "drafter": str(drafter), "drafter_trained": trained,
                           "num_speculative_tokens": ks, "concurrency": concurrency, "num_prompts": 8,
                           "max_tokens": 32, "warmup_prompts": 2, "temperature": 0.0, **bench}}
    return write_tiny_config(tmp_path, overrides)


@pytest.fixture(scope="module")
def constant_run(tiny_constant_model, constant_drafter, tmp_path_factory):
    """The whole phase once: baseline + k in {1, 3} at concurrency {1, 4} (3 servers)."""
    from eagle3.phase_runner import supervisor

    cfg = _bench_config(tmp_path_factory.mktemp("bench-constant"), tiny_constant_model, constant_drafter,
                        trained=True, ks=[1, 3], concurrency=[1, 4])
    sup = supervisor(cfg)
    progress = []
    t0 = time.monotonic()
    with subscribed(counts("bench", lambda d, t: progress.append((d, t)))):
        summary = run_bench(cfg, sup)
    print(f"bench phase (3 servers, 6 client runs): {time.monotonic() - t0:.0f} s")
    assert not sup.registry.entries(), "the phase left a registered process behind"
    return cfg, summary, progress


def _results_of(cfg) -> dict:
    return json.loads(BenchPaths.of(cfg).results.read_text())


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(2400)
def test_phase_outputs_json_report_trend_history(constant_run):
    cfg, summary, progress = constant_run
    paths = BenchPaths.of(cfg)
    results = _results_of(cfg)
    assert progress[-1] == (6, 6)
    assert paths.trend.is_file() and not list(paths.dir.rglob("*.png"))  # the tables, no plot
    report = paths.report.read_text()
    assert "| k=3 | 4 |" in report and "Acceptance gate** (passed)" in report
    history = sorted(paths.history.glob("*.json"))
    assert len(history) == 1 and json.loads(history[0].read_text()) == results
    assert paths.history.parent == cfg.run_dir  # outside the phase dir, which a forced rerun wipes
    assert results["engine_version"] == "0.32.0" and results["config_hash"] == cfg.fingerprint()
    assert results["drafter"]["path"] == str(cfg.bench.drafter) and results["drafter"]["trained"] is True
    assert [r["label"] for r in results["servers"]] == ["baseline", "k=1", "k=3"]
    assert len(results["handoffs"]) == 2  # the core handoff between each two servers
    assert summary.details["gate"] == "passed" and set(summary.details["best_k"]) == {"1", "4"}
    rows = summary.details["table"]
    assert len(rows) == 6 and all(r["completed"] == 8 and r["failed"] == 0 for r in rows)
    for row in rows:
        if row["k"]:
            base = [r for r in rows if r["k"] == 0 and r["concurrency"] == row["concurrency"]][0]
            # The table rounds a speedup to 3 decimals and each tok/s to 2: for the constant drafter's ~0.04x
            # that alone can pass 1 % (CI, 2026-12-06: 0.043 against 0.0425), hence an absolute 0.001 beside it.
            assert row["speedup"] == pytest.approx(row["output_tok_s"] / base["output_tok_s"], rel=0.01, abs=1e-3)


@pytest.mark.slow
@pytest.mark.engine
def test_every_acceptance_number_is_the_servers_counter_delta(constant_run):
    cfg, _, _ = constant_run
    for server in _results_of(cfg)["servers"]:
        windows = server["windows"]
        for w in windows:
            # The server finished exactly the load generator's requests and tokens in the window:
            # nothing else was measured (a window shared with other traffic is measured again).
            served, load = w["traffic_delta"], w["load"]
            assert served["requests"] == load["completed"] == 8 and load["failed"] == 0
            assert served["generation_tokens"] == load["total_output_tokens"]
            if w["discarded_attempts"]:
                print(f"{server['label']} c={w['concurrency']}: re-measured after {w['discarded_attempts']}")
        if server["k"] == 0:
            # Without a drafter the server counts no speculation, and the JSON claims none.
            assert server["counters_at_ready"] is None and all(w["acceptance"] is None for w in windows)
            assert all(w["client_spec"] is None for w in windows)
            continue
        k = server["k"]
        ready, stop = (SpecCounters.from_dict(server[x]) for x in ("counters_at_ready", "counters_at_stop"))
        # The warm-up speculated (it is real traffic), but before the first window.
        assert (SpecCounters.from_dict(windows[0]["counters_before"]) - ready).drafts > 0
        pooled = SpecCounters(0, 0, 0, (0,) * k)
        for w in windows:
            pooled = pooled + SpecCounters.from_dict(w["delta"])
        stop - (ready + pooled)  # raises MetricsError if the windows claim more than the server counted
        for w in windows:
            delta = SpecCounters.from_dict(w["counters_after"]) - SpecCounters.from_dict(w["counters_before"])
            assert delta.to_dict() == w["delta"]
            assert w["acceptance"] == acceptance(delta, engine_registry.get("vllm").acceptance_source).to_dict()
            # `vllm bench serve` read /metrics itself around its own run: the same window.
            client = w["client_spec"]
            assert (client["drafts"], client["draft_tokens"], client["accepted"]) == \
                   (delta.drafts, delta.draft_tokens, delta.accepted)
            assert client["acceptance_length"] == pytest.approx(w["acceptance"]["acceptance_length"])
            assert client["acceptance_rate"] == pytest.approx(w["acceptance"]["acceptance_rate"])
            assert client["per_position"] == pytest.approx(w["acceptance"]["per_position"])
            # The constant target always emits token 0 and the constant drafter always drafts it.
            assert delta.draft_tokens == k * delta.drafts > 0
            assert w["acceptance"]["acceptance_rate"] == 1.0
            assert w["acceptance"]["acceptance_length"] == k + 1
            assert w["acceptance"]["per_position"] == [1.0] * k
            print(f"k={k} c={w['concurrency']}: drafts {delta.drafts}, AL {w['acceptance']['acceptance_length']}, "
                  f"{w['load']['output_throughput']:.1f} tok/s")


@pytest.mark.slow
@pytest.mark.engine
def test_gate_failure_and_untrained_report_reuse_the_measurements(constant_run, tmp_path):
    """A floor above k+1 fails the trained drafter (GateError, evidence written first); the same
    numbers from an untrained drafter are reported. Both re-judge the saved server runs: no server starts."""
    cfg, _, _ = constant_run
    from tests.conftest import write_tiny_config
    from eagle3.phase_runner import supervisor

    raw = json.loads(json.dumps(cfg.model_dump(mode="json")))
    log = cfg.phase_dir("bench") / "logs" / "vllm-server.log"
    launches = log.read_text().count("==> eagle3: launching")
    (tmp_path / "strict").mkdir()
    (tmp_path / "untrained").mkdir()
    strict = write_tiny_config(tmp_path / "strict", {**raw, "bench": {**raw["bench"], "acceptance_floor": 4.5}},
                               run_dir=cfg.run_dir)
    with pytest.raises(GateError) as err:
        run_bench(strict, supervisor(strict))
    msg = str(err.value)
    assert "below the floor 4.5" in msg and "wrong aux layers" in msg and "weights dropped at load" in msg
    failed = _results_of(strict)
    assert failed["gate"]["status"] == "failed" and failed["gate"]["best_acceptance_length"] == 4.0
    assert "Likely causes" in BenchPaths.of(strict).report.read_text()

    untrained = write_tiny_config(tmp_path / "untrained", {**raw, "bench": {
        **raw["bench"], "acceptance_floor": 4.5, "drafter_trained": False}}, run_dir=cfg.run_dir)
    summary = run_bench(untrained, supervisor(untrained))
    assert summary.details["gate"] == "reported" and summary.details["trained"] is False
    assert log.read_text().count("==> eagle3: launching") == launches, "a server was started again"
    assert len(list(BenchPaths.of(cfg).history.glob("*.json"))) == 3  # every run adds to the history


@pytest.fixture(scope="module")
def untrained_k3(comparison_target, random_drafter, tmp_path_factory):
    """One server: a tiny target with an untrained (random) drafter, k=3."""
    from eagle3.engines.vllm import write_prompts as write_vllm_dataset
    from eagle3.bench.measure import measure_server
    from eagle3.phase_runner import supervisor

    cfg = _bench_config(tmp_path_factory.mktemp("bench-untrained"), comparison_target, random_drafter, trained=False,
                        ks=[3], concurrency=[1])
    prompts = held_out_prompts(cfg)
    dataset = write_vllm_dataset(cfg.phase_dir("bench") / "prompts.jsonl", prompts["texts"])
    return measure_server(cfg, supervisor(cfg), "k=3", 3, str(random_drafter), dataset, prompts["count"],
                          prompts["warmup_texts"])


@pytest.mark.slow
@pytest.mark.engine
def test_untrained_drafter_acceptance_is_near_zero(untrained_k3):
    (w,) = untrained_k3["windows"]
    acc = w["acceptance"]
    print(f"untrained k=3: {acc}")
    assert acc["drafts"] > 0 and acc["draft_tokens"] == 3 * acc["drafts"]
    assert acc["acceptance_rate"] < 0.05 and acc["acceptance_length"] < 1.15
    assert w["client_spec"]["accepted"] == acc["accepted"]


@pytest.mark.slow
@pytest.mark.engine
def test_trained_fixture_beats_the_untrained_drafter(comparison_target, untrained_k3, tmp_path):
    if not (TRAINED_FIXTURE / "config.json").is_file():
        pytest.skip(f"no trained tiny drafter at {TRAINED_FIXTURE} (it is produced on a GPU by the training issue; "
                    "set EAGLE3_TRAINED_DRAFTER_FIXTURE to use another path)")
    from eagle3.engines.vllm import write_prompts as write_vllm_dataset
    from eagle3.bench.measure import measure_server
    from eagle3.phase_runner import supervisor

    assert comparison_target == FIXTURE_TARGET, "the fixture drafter was trained for the fixture target"
    cfg = _bench_config(tmp_path, comparison_target, TRAINED_FIXTURE, trained=True, ks=[3], concurrency=[1])
    prompts = held_out_prompts(cfg)
    dataset = write_vllm_dataset(cfg.phase_dir("bench") / "prompts.jsonl", prompts["texts"])
    run = measure_server(cfg, supervisor(cfg), "k=3", 3, str(TRAINED_FIXTURE), dataset, prompts["count"],
                         prompts["warmup_texts"])
    trained, untrained = run["windows"][0]["acceptance"], untrained_k3["windows"][0]["acceptance"]
    print(f"trained AL {trained['acceptance_length']:.3f} vs untrained {untrained['acceptance_length']:.3f}")
    assert trained["acceptance_length"] > untrained["acceptance_length"]
    assert trained["acceptance_rate"] > untrained["acceptance_rate"]


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("schedule", ["interleaved", "alternating"])
def test_the_interleaved_schedule_serves_every_config_at_once_and_pairs_their_windows(
        tiny_constant_model, constant_drafter, tmp_path, schedule):
    """bench.schedule interleaved on real vLLM CPU servers: the baseline, k=1 and the baseline's twin run at
    once on their own ports (one start each, no handoff between them), started side by side (the default
    for vLLM) with the KV cache the pack sized, the twin once the baseline is ready; their windows take
    turns in time (the order rotated each repeat), each speedup is paired slot by slot, and the phase ends
    with every server gone. Alternating: the same servers take turns request by request within each slot,
    the pack's streaming client sending them, each server's share checked against its own counters."""
    from eagle3.engines.probe import inspect_engine
    from eagle3.phase_runner import supervisor
    from eagle3.process import procfs

    cfg = _bench_config(tmp_path, tiny_constant_model, constant_drafter, trained=True, ks=[1], concurrency=[1],
                        schedule=schedule, windows=2, aa_twin=True)
    # The tiny config's VLLM_CPU_KVCACHE_SPACE would override the size the pack gives (vLLM's legacy CPU
    # setting): left out, so that the server's own count of its cache shows the pack's size.
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    env = {k: v for k, v in cfg.engines.vllm.env.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    cfg = cfg.model_copy(update={"engines": cfg.engines.model_copy(update={
        "vllm": cfg.engines.vllm.model_copy(update={"env": env})})})
    assert cfg.bench.side_by_side()
    sup = supervisor(cfg)
    inspect_engine(cfg, sup, "vllm")  # as the preflight does: the compile cache keys a start by the probed versions
    summary = run_bench(cfg, sup)
    results = _results_of(cfg)
    base, k1, twin = results["servers"]
    ports = cfg.bench.server_ports()
    assert [base["label"], k1["label"], twin["label"]] == ["baseline", "k=1", "baseline (twin)"]
    assert k1["port"] == ports[1] and twin["port"] == ports[2] and "port" not in base
    assert len({s["log"] for s in (base, k1, twin)}) == 3 and all(Path(s["log"]).is_file() for s in (base, k1, twin))
    # Side by side: the baseline and k=1 were both launched before either was ready; the twin after the
    # baseline was ready, so it found the baseline's compile directory complete instead of compiling apart.
    assert max(base["launched_at"], k1["launched_at"]) < min(base["ready_at"], k1["ready_at"])
    assert twin["launched_at"] >= base["ready_at"]
    [starts] = results["round_starts"]
    assert starts["start"] == "side by side" and starts["servers"] == 3
    assert starts["first_launch_to_last_ready_s"] < starts["sum_of_starts_s"]
    rows = {r["name"]: r for r in map(json.loads, cfg.layout.server_starts.read_text().splitlines())}
    base_row, twin_row = rows["bench-vllm-server-baseline"], rows["bench-vllm-server-baseline-twin"]
    assert twin_row["compile_cache"]["key"] == base_row["compile_cache"]["key"] != ""
    assert twin_row["compile_cache"]["reused"] and not twin_row["compile_cache"]["busy"]
    # Each server took the pack's size and counts the tokens it was sized for: one request of
    # max_model_len (1024) plus a block, at concurrency 1, rounded up to a power of two, 2048; k=1's size
    # holds its drafter's layer too.
    flag = "--kv-cache-memory-bytes"
    sizes = [int(s["argv"][s["argv"].index(flag) + 1]) for s in (base, k1, twin)]
    assert sizes[0] == sizes[2] < sizes[1]
    for s in (base, k1, twin):
        said = re.findall(r"KV cache size: ([\d,]+) tokens", Path(s["log"]).read_text(errors="replace"))
        assert said and int(said[-1].replace(",", "")) == 2048, (s["label"], said)
    if schedule == "interleaved":  # the windows take turns (impossible one server at a time), slot 2 from k=1
        order = sorted((w["started_at"], s["label"], w["slot"]) for s in (base, k1, twin) for w in s["windows"])
        assert [(label, slot) for _, label, slot in order] == [
            ("baseline", "r1w1"), ("k=1", "r1w1"), ("baseline (twin)", "r1w1"),
            ("k=1", "r1w2"), ("baseline (twin)", "r1w2"), ("baseline", "r1w2")]
    else:  # the requests take turns, each slot's first server rotating; each server's share its own counters'
        for s in (base, k1, twin):
            for w in s["windows"]:
                assert w["traffic_delta"]["requests"] == len(w["load"]["requests"]) == 8
                assert w["traffic_delta"]["generation_tokens"] == w["load"]["total_output_tokens"]
        first = [min((r["started_at"], s["label"]) for s in (base, k1, twin) for w in s["windows"] if w["slot"] == slot
                     for r in w["load"]["requests"])[1] for slot in ("r1w1", "r1w2")]
        assert first == ["baseline", "k=1"]
        sent = sorted((r["started_at"], s["label"]) for s in (base, k1, twin) for w in s["windows"]
                      if w["slot"] == "r1w1" for r in w["load"]["requests"])
        assert [label for _, label in sent[:6]] == ["baseline", "k=1", "baseline (twin)", "k=1", "baseline (twin)",
                                                    "baseline"]
        assert k1["windows"][0]["acceptance"]["acceptance_length"] > 1
    assert results["handoffs"] == [] and results["schedule"] == schedule
    [row] = [r for r in results["table"] if r["k"] == 1]
    assert row["speedup_method"] == "paired over 2 window slots" and row["windows"] == 2
    assert all(w["load"]["completed"] == 8 and w["load"]["failed"] == 0
               for s in (base, k1, twin) for w in s["windows"])
    assert not sup.registry.entries(), "the phase left a registered process behind"
    assert not procfs.listening_ports(set(ports)), "a server's port is still open"
    report = Path(summary.details["report"]).read_text()
    assert summary.details["gate"] == "passed" and "each speedup is paired slot by slot" in report
    assert f"(schedule {schedule})" in report
    assert "3 servers side by side, the last ready" in report
