"""The bench/ scripts still run against the pack's current interfaces: each in its smoke mode (the
script's own code path at the smallest size, nothing recorded). The client benchmarks, which use the
session's shared vLLM CPU server, are in test_bench_client_scripts.py: a module that uses that server
runs on the worker holding it (tests/xdist_plan.py), and the smokes here, which start servers of their
own, need not. bench/datagen_vs_vllm_bench.py broke silently once, when the phases
began returning a PhaseSummary (issue 22), and bench/record_bench_history.py had broken the same way.
The GPU-only scripts (handoff_bench.py, devfile_probe.py) run on a CPU stand-in here; the shell
scripts, which drive the H200 machine, are checked for syntax and their usage line. A new script
under bench/ fails test_every_bench_script_has_a_smoke_test until it gets one."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(600)
SMOKED = {"datagen_vs_vllm_bench.py", "datagen_client_split.py", "handoff_bench.py", "devfile_probe.py", "flow_overhead_bench.py",
          "parity_probe.py", "record_bench_history.py", "gpu_e2e_record.py",  # gpu_e2e_record: tests/bench/test_gpu_record.py
          "fanout_bench.py", "first_phase_bench.py", "one_server_probe.py", "noise_sampler.py",
          "startup_probe.py", "modelinfo_share_bench.py", "side_by_side_bench.py", "drafter_acceptance.py",
          "draft_vocab_coverage.py", "derive_profile.py", "alternation_probe.py", "pack_aa_bench.py",
          "idle_ttft_probe.py", "rerun_alarms.py", "epoch_lever.py", "self_prompt_mix.py"}  # derive_profile: tests/bench/test_derive_profile.py; fanout_bench: tests/flows/test_fanout.py, on that test's two nodes
SHELL = {"gpu_carry.sh", "gpu_e2e.sh", "gpu_fetch.sh", "gpu_pack_deps.sh", "gpu_put.sh", "gpu_sglang.sh",
         "gpu_sglang_deps.sh", "gpu_slim.sh", "gpu_wait.sh", "run_on_gpu.sh"}
engine = [pytest.mark.slow, pytest.mark.engine]


def _script(name: str, *args: str, timeout: float = 500, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, str(REPO / "bench" / name), *args], capture_output=True, text=True,
                         timeout=timeout, cwd=REPO, **kw)
    assert res.returncode == 0, f"{name}: rc {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    return res


def test_every_bench_script_has_a_smoke_test():
    scripts = {p.name for p in (REPO / "bench").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts == SMOKED | SHELL, f"add a smoke test for {sorted(scripts - SMOKED - SHELL)}"


@pytest.mark.parametrize("name", sorted(SHELL))
def test_the_shell_scripts_parse_and_print_their_usage(name):
    path = REPO / "bench" / name
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    if name != "run_on_gpu.sh":  # it takes no arguments: it runs the GPU tests at once
        res = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=30, cwd=REPO)
        assert res.returncode != 0 and "usage" in res.stderr, res.stderr


def _sh(name: str, *args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "bench" / name), *map(str, args)], capture_output=True, text=True,
                          timeout=60, **kw)


def test_gpu_put_makes_its_folder_and_leaves_no_partial_piece(tmp_path):
    """Any carry may be the first command a fresh machine runs: the piece's folder is made by each."""
    src = tmp_path / "piece07"
    src.write_bytes(b"x" * 1000)
    assert _sh("gpu_put.sh", src, tmp_path / "stage" / "drafter", "d.part07").returncode == 0
    assert [(f.name, f.stat().st_size) for f in (tmp_path / "stage" / "drafter").iterdir()] == [("d.part07", 1000)]


def test_gpu_slim_leaves_the_raw_records_behind_and_puts_every_file_back(tmp_path):
    """What travels is what `git ls-files` and the untracked, not ignored files hold: `on` takes the raw
    records, the tests but tests/gpu and the shipped weights out of both, on disk still; `off` restores index
    and exclude."""
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    (repo / "bench" / "gpu_slim.sh").write_bytes((REPO / "bench" / "gpu_slim.sh").read_bytes())
    for rel, size in [("bench/results/run/raw.json", 5000), ("tests/test_x.py", 300), ("tests/gpu/cuda_service.py", 50),
                      ("configs/drafters/smollm2-135m-h200/model.safetensors.xz", 9000),
                      ("configs/drafters/smollm2-135m-h200/config.json", 40), ("eagle3/core.py", 200)]:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_bytes(b"x" * size)
    # No user's or system's git config: a global core.hooksPath would keep the script from installing its guard.
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    git = lambda *a, check=True: subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True,
                                                 check=check, env=env)
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "all")):
        git(*args)
    travels = lambda: sorted({*git("ls-files").stdout.split(),
                              *git("ls-files", "--others", "--exclude-standard").stdout.split()})
    before = travels()
    slim = lambda what: subprocess.run(["bash", str(repo / "bench" / "gpu_slim.sh"), what], capture_output=True,
                                       text=True, timeout=30, env=env)
    assert slim("on").returncode == 0 and slim("status").stdout.strip() == "on"
    assert travels() == ["bench/gpu_slim.sh", "configs/drafters/smollm2-135m-h200/config.json", "eagle3/core.py",
                         "tests/gpu/cuda_service.py"]  # the handoff bench's CUDA service travels
    assert (repo / "bench/results/run/raw.json").stat().st_size == 5000  # left on disk
    assert slim("on").stdout.startswith("gpu_slim: already on")
    refused = git("commit", "-qm", "would delete the records", check=False)
    assert refused.returncode != 0 and "gpu_slim is on" in refused.stderr  # the staged removal never lands
    assert slim("off").returncode == 0 and slim("status").stdout.strip() == "off"
    assert travels() == before and git("status", "--porcelain").stdout == ""
    assert "gpu_slim" not in (repo / ".git/info/exclude").read_text()
    assert not (repo / ".git/hooks/pre-commit").exists()


def test_gpu_fetch_refuses_a_missing_results_dir_and_sends_each_drafter_piece_once(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    res = _sh("gpu_fetch.sh", tmp_path / "gone", out)
    assert res.returncode == 1 and "no " in res.stderr and not any(out.iterdir())
    results = tmp_path / "e2e"
    (results / "drafter-qwen").mkdir(parents=True)
    (results / "events.jsonl").write_text("{}\n")
    for i in range(5):
        (results / "drafter-qwen" / f"model.safetensors.part{i:02d}").write_bytes(b"w" * 10)
    sent = []
    for _ in range(2):  # the drafter is not whole yet (no sha256): nothing of it is sent
        assert _sh("gpu_fetch.sh", results, out).returncode == 0
        sent.append(sorted(f.name for f in out.iterdir() if f.name != "rec.tgz"))
    (results / "drafter-qwen" / "model.safetensors.sha256").write_text("abc  model.safetensors\n")
    for _ in range(3):
        for f in out.iterdir():
            f.unlink()
        assert _sh("gpu_fetch.sh", results, out).returncode == 0
        sent.append(sorted(f.name for f in out.iterdir() if f.name != "rec.tgz"))
    parts = [f"model.safetensors.part{i:02d}" for i in range(5)]
    assert sent == [[], [], parts[:3], parts[3:], []]
    listing = subprocess.run(["tar", "tzf", str(out / "rec.tgz")], capture_output=True, text=True).stdout
    assert "events.jsonl" in listing and ".part0" not in listing and ".sent" not in listing


def test_handoff_bench_smoke():
    res = _script("handoff_bench.py", "--smoke", timeout=120)
    result = json.loads(res.stdout[res.stdout.index("{"):])
    assert result["pack_rounds"] == result["ritual_rounds"] == result["floor_rounds"] == 1
    assert "not a measurement" in result["smoke"]


def test_epoch_lever_reads_what_each_epoch_bought(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"INFO val/full_acc_0_epoch={a}, val/full_acc_1_epoch={b}, val/full_acc_2_epoch={c}\n"
                           for a, b, c in ((0.5, 0.3, 0.2), (0.7, 0.5, 0.3))))
    _script("epoch_lever.py", str(log), "--json", str(tmp_path / "e.json"), timeout=60)
    rows = json.loads((tmp_path / "e.json").read_text())["epochs"]
    assert [(r["epoch"], r["expected_length"], r["gain"]) for r in rows] == [(1, 2.0, None), (2, 2.5, 0.5)]


def test_self_prompt_mix_counts_each_share_of_both_row_shapes(tmp_path):
    samples = tmp_path / "samples.jsonl"  # a datagen samples file: only its `self-` rows are written turns
    samples.write_text("".join(json.dumps({"id": i, "conversations": [{"role": "user", "content": t}]}) + "\n" for i, t in [
        ("p-1", "Write a Python function"), ("self-00000", "Q: what is 2+2?"), ("self-00001", "Fix this bug:\n```x```"),
        ("self-00002", "写一个排序函数"), ("self-00003", "Tell me about whales")]))
    back = tmp_path / "self-prompts.jsonl.gz"  # what bench/gpu_e2e.sh brings back
    with gzip.open(back, "wt") as f:
        f.write(json.dumps({"id": "self-00000", "text": "Qwen here. A regex for dates?"}) + "\n")
    out = _script("self_prompt_mix.py", str(samples), str(back)).stdout
    first, second = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
    assert first["turns"] == 4 and [first[k]["count"] for k in ("code", "cjk", "habit")] == [1, 1, 1]
    assert second["turns"] == 1 and [second[k]["count"] for k in ("code", "cjk", "habit")] == [1, 0, 1]
    low, high = first["code"]["ci95"]
    assert 0 < low < 0.25 < high < 1


def test_noise_sampler_smoke():
    res = _script("noise_sampler.py", "--smoke", timeout=60)
    result = json.loads(res.stdout)
    # Four samples taken, and the one stand-in request lies within them: explain matched it to samples.
    assert result["sampled"] == 4 and result["explain"]["samples"] == 4
    assert result["explain"]["servers"]["baseline"]["requests"] == 1


def test_noise_sampler_records_steal_time_and_explain_correlates_it(tmp_path):
    """Each sample carries the hypervisor's steal time (Linux: a share of the interval, 0-100) and the
    kernel's CPU clock; explain correlates TPOT with steal: here requests that ran while steal was high
    were slow, and the correlation says so."""
    sys.path.insert(0, str(REPO / "bench"))
    import noise_sampler

    path = tmp_path / "s.jsonl"
    assert noise_sampler.sample(path, 0.05, gpu=False, count=3) == 3
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(0 <= r["steal_pct"] <= 100 for r in rows), rows
    synthetic = tmp_path / "synthetic.jsonl"
    synthetic.write_text("".join(json.dumps({"t": i + 0.5, "cpu_pct": [10.0], "load1": 0.1, "procs": [],
                                             "steal_pct": 40.0 if i % 2 else 0.0, "cpu_mhz": 2000}) + "\n"
                                 for i in range(10)))
    requests = [{"latency_ms": 1000.0, "ttft_ms": 0.0, "output_tokens": 101 if i % 2 == 0 else 51} for i in range(9)]
    result = {"servers": [{"label": "baseline", "k": 0, "windows": [
        {"concurrency": 1, "started_at": 0.0, "load": {"requests": requests}}]}]}
    row = noise_sampler.explain(synthetic, result)["servers"]["baseline"]
    # Request i spans [i, i+1] s, with one sample in it: odd ones ran under steal 40 % at twice the TPOT.
    assert row["requests"] == 9 and row["corr_tpot_steal_pct"] > 0.5, row


def test_startup_probe_smoke_and_its_importtime_summary(tmp_path):
    res = _script("startup_probe.py", "--smoke", "--out", str(tmp_path / "p.json"), timeout=60)
    result = json.loads((tmp_path / "p.json").read_text())
    assert set(result["steps"]) == {"python -c pass #1", "python -c pass #2", "pure-Python loop, 1e7 adds"}
    assert "not a measurement" in result["smoke"] and "pure-Python loop" in res.stdout
    sys.path.insert(0, str(REPO / "bench"))
    from startup_probe import importtime_summary

    lines = ["import time: self [us] | cumulative | imported package", "import time:      1000 |       1000 |   a.b",
             "import time:      3000 |       4000 | a", "import time:     20000 |      20000 | c"]
    summary = importtime_summary("\n".join(lines))
    # Top-level packages by their cumulative time (a nested import counted once, in its parent).
    assert summary["packages_s"] == {"c": 0.02, "a": 0.004} and summary["modules"] == 3
    assert list(summary["modules_self_s"]) == ["c", "a", "a.b"]


def test_startup_probe_dumps_the_prefect_servers_stacks_while_it_starts(tmp_path, monkeypatch):
    """The run's real Prefect server (flows/local_server.py), started with the probe's stack dumps every
    0.5 s: it answers, the dumps name frames of its start, and the probe's environment is put back."""
    sys.path.insert(0, str(REPO / "bench"))
    import startup_probe

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    before = os.environ.get("PYTHONPATH")
    out = startup_probe.prefect_server_start(tmp_path, stacks_every=0.5)
    assert os.environ.get("PYTHONPATH") == before and "EAGLE3_STACKS_FILE" not in os.environ
    stacks = out["stacks"]
    assert out["seconds"] > 0 and stacks["dumps"] >= 1, out
    assert stacks["innermost_frames"] and all(f.startswith("File ") for f in stacks["innermost_frames"])
    assert stacks["main_thread"] and "MainThread 0x" in stacks["last_dump"]


@pytest.mark.slow
@pytest.mark.engine
def test_modelinfo_share_bench_smoke():
    """Three real vLLM CPU starts: the warm-up fills the shared answers; the "own" start, with them
    removed, inspects the model in vLLM's subprocess, the "shared" one finds them; each under a key of its own."""
    res = _script("modelinfo_share_bench.py", "--smoke", timeout=400)
    result = json.loads(res.stdout[res.stdout.index("{\n"):])
    (row,) = result["rounds"]
    assert row["own"]["key"] != row["shared"]["key"] and row["own"]["shared"] == row["shared"]["shared"]
    assert result["median_s"]["own"] > 0 and "not a measurement" in result["smoke"]


@pytest.mark.slow
@pytest.mark.engine
def test_side_by_side_bench_smoke():
    """Two real bench phases on vLLM CPU servers (baseline and k=1; the measurement adds the twin): one round
    one by one, one side by side."""
    res = _script("side_by_side_bench.py", "--smoke", timeout=500)
    assert "one_by_one: last ready" in res.stdout and "side_by_side: last ready" in res.stdout
    assert "ratio per round" in res.stdout


@pytest.mark.slow
@pytest.mark.engine
def test_drafter_acceptance_smoke(smollm2_model):
    """The real target with a random drafter at k=1, through `eagle3 run --only bench`."""
    res = _script("drafter_acceptance.py", "--smoke", timeout=500)
    assert "k=1: acceptance length" in res.stdout and "per position" in res.stdout


def test_pack_aa_bench_bins_each_request_by_its_own_servers_idle_time():
    """Idle time is since the same server's previous request ended (not another server's); a server's
    first request, and rows without a start time (the load generator's), are left out."""
    sys.path.insert(0, str(REPO / "bench"))
    import pack_aa_bench

    def req(start, latency_ms, ttft):
        return {"started_at": start, "latency_ms": latency_ms, "ttft_ms": ttft}

    results = {"servers": [
        {"windows": [{"load": {"requests": [req(0.0, 1000, 70), req(2.2, 1000, 1000), req(3.2, 1000, 60)]}}]},
        {"windows": [{"load": {"requests": [req(1.0, 1000, 80), req(7.0, 500, 90), {"ttft_ms": 5, "latency_ms": 9}]}}]}]}
    bins = {tuple(r["idle_s"]): (r["n"], r["median_ttft_ms"], r["share_slow"])
            for r in pack_aa_bench.ttft_by_idle(results)}
    # server 0: idle 1.2 s then 0.0 s; server 1: idle 5.0 s
    assert bins == {(0, 0.5): (1, 60.0, 0.0), (1, 1.5): (1, 1000.0, 1.0), (3, 10): (1, 90.0, 0.0)}


@pytest.mark.slow
@pytest.mark.engine
def test_pack_aa_bench_smoke(smollm2_model):
    """Each schedule's A/A config, derived from the demo's, passes `eagle3 validate` (the servers' runs
    are tests/phases/test_bench.py's interleaved/alternating test, with the twin)."""
    res = _script("pack_aa_bench.py", "--smoke", timeout=120)
    assert res.stdout.count(": valid") == 2 and "interleaved" in res.stdout and "alternating" in res.stdout


@pytest.mark.slow
@pytest.mark.engine
def test_draft_vocab_coverage_smoke(smollm2_model):
    """In the engine's environment (transformers), with a random drafter of the real target."""
    from eagle3.drafters.testmaker import DrafterSpec, ensure_drafter
    from eagle3.tinymodel import default_engine
    from tests.conftest import ENGINE_PYTHON

    drafter = ensure_drafter(REPO / "models" / "smollm2-drafter-random", smollm2_model, default_engine(), DrafterSpec())
    res = subprocess.run([str(ENGINE_PYTHON), str(REPO / "bench" / "draft_vocab_coverage.py"), "--smoke", "--drafter",
                          str(drafter)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "4 answers" in res.stdout and "inside the draft vocabulary" in res.stdout


def test_first_phase_bench_smoke():
    res = _script("first_phase_bench.py", "--smoke", timeout=180)
    result = json.loads(res.stdout[res.stdout.rindex("\n{") + 1:])
    [rep] = result["reps"]
    variants = ("serial", "overlapped-one-by-one", "overlapped", "rerun")
    assert set(variants) <= set(rep) and "not a measurement" in result["smoke"]
    assert all(rep[k]["to_first_phase_s"] >= rep[k]["server_s"] > 0 for k in variants)


@pytest.mark.slow
@pytest.mark.engine
def test_one_server_probe_smoke():
    """Two real vLLM CPU servers (plain and extracting) on the same greedy requests: docs/FACTS.md §12's
    facts at the smallest size (the same greedy text; a hidden-state file per generation request)."""
    res = _script("one_server_probe.py", "--smoke", timeout=400)
    result = json.loads(res.stdout[res.stdout.index("{"):])
    assert result["prompts"] == 2 and result["plain"]["output_tokens"] == 16 and "not a measurement" in result["smoke"]
    assert result["texts_equal"] == result["token_ids_equal"] == 2
    assert sum("hidden_states" in s for s in result["file_tensor_shapes"]) == 2


def test_alternation_probe_sends_each_request_once_to_each_server_in_its_designs_order():
    """The two designs differ only in order: windows send a block's requests to A, then all to B;
    alternating sends each request to both before the next, A first and B first in turn."""
    sys.path.insert(0, str(REPO / "bench"))
    import alternation_probe as alt

    bodies = ["p0", "p1", "p2", "p3"]
    windows, alternating = alt.order("windows", bodies), alt.order("alternating", bodies)
    assert windows == [("A", b) for b in bodies] + [("B", b) for b in bodies]
    assert alternating == [("A", "p0"), ("B", "p0"), ("B", "p1"), ("A", "p1"),
                           ("A", "p2"), ("B", "p2"), ("B", "p3"), ("A", "p3")]
    assert sorted(windows) == sorted(alternating)  # the same requests, to the same servers
    three = alt.order("alternating", bodies[:3], ("A", "B", "S"))  # a drafter's server too: who goes first rotates
    assert [s for s, _ in three] == ["A", "B", "S", "B", "S", "A", "S", "A", "B"]
    assert sorted(three) == sorted(alt.order("windows", bodies[:3], ("A", "B", "S")))
    same = alt.interval([1.0, 1.0, 1.0])
    assert same["ratio"] == 1.0 and same["halfwidth_pct"] == 0.0
    spread = alt.interval([0.9, 1.1, 0.95, 1.05])
    assert spread["ci"][0] < 1.0 < spread["ci"][1] and spread["halfwidth_pct"] > 5


@pytest.mark.slow
@pytest.mark.engine
def test_alternation_probe_smoke(tmp_path):
    """A real vLLM CPU server as both A and B (the measurement starts two): both designs, block by block,
    each block a ratio and each design an interval over its blocks."""
    out = tmp_path / "alt.json"
    res = _script("alternation_probe.py", "--smoke", "--json", str(out), timeout=400)
    result = json.loads(out.read_text())
    assert result["smoke"] and "half-width alternating / windows" in res.stdout
    for design in ("windows", "alternating"):
        assert list(result[design]) == ["B/A"]  # no --drafter: the twin alone
        r = result[design]["B/A"]
        assert r["blocks"] == len(r["per_block"]) == 2 and all(x > 0 for x in r["per_block"])
        assert r["ci"][0] <= r["ratio"] <= r["ci"][1]


def test_devfile_probe_smoke():
    res = _script("devfile_probe.py", "--smoke", timeout=60)
    result = json.loads(res.stdout)
    assert result["fds"] == [] and result["visible"] == "1"


@pytest.mark.slow
def test_flow_overhead_bench_smoke():
    res = _script("flow_overhead_bench.py", "--smoke", env={k: v for k, v in os.environ.items()
                                                            if not k.startswith("PREFECT_")})
    assert "rep 1:" in res.stdout and "median of 1" in res.stdout and "(smoke: not judged)" in res.stdout


@pytest.mark.parametrize("name", ["parity_probe.py", "record_bench_history.py"])
@pytest.mark.slow
@pytest.mark.engine
def test_the_vllm_bench_scripts_smoke(name, tmp_path):
    res = _script(name, str(tmp_path / "out"), "--smoke")
    if name == "parity_probe.py":
        assert res.stdout.startswith("smoke rows 0-1"), res.stdout
    else:
        assert "run 1: " in res.stdout and len(list((tmp_path / "out" / "history").glob("*.json"))) == 1


def test_the_gpu_engine_wrappers_keep_the_client_auth_dir_and_drop_the_pack_s_site(tmp_path):
    """On the H200 (2026-12-02, bench/results/sglang-h200-20261202-run2/e2e.log) the wrappers replaced
    PYTHONPATH with the engine's site dir, dropping the client-auth dir the pack puts first for
    speculators' clients: prepare-data's render calls went out without the run's key, got 401 from the
    pack's own vLLM server, and extraction failed with "No samples remain after preprocessing"."""
    from eagle3.engines.serving import CLIENT_AUTH_DIR

    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "gpu_e2e.sh").write_text((REPO / "bench" / "gpu_e2e.sh").read_text())
    site = tmp_path / "site"
    (site / "engine").mkdir(parents=True)
    (site / "pack").mkdir()
    env = {**os.environ, "SITE": str(site)}
    subprocess.run(["bash", str(tmp_path / "bench" / "gpu_e2e.sh"), str(tmp_path / "res"), "wrappers"],
                   check=True, env=env, capture_output=True, timeout=30)
    inherited = os.pathsep.join([str(CLIENT_AUTH_DIR), str(site / "pack"), str(tmp_path)])
    out = subprocess.run([str(tmp_path / ".gpu-engine" / "bin" / "python"), "-c",
                          "import json, sys, sitecustomize; print(json.dumps([sys.path, sitecustomize.__file__]))"],
                         env={**env, "PYTHONPATH": inherited}, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    path, custom = json.loads(out.stdout)
    assert path.index(str(CLIENT_AUTH_DIR)) < path.index(str(site / "engine"))
    assert str(site / "pack") not in path and str(tmp_path) not in path
    assert custom.startswith(str(CLIENT_AUTH_DIR))  # the sitecustomize that adds the key is the one loaded


def test_rerun_alarms_judges_its_recorded_reruns_as_recorded(tmp_path):
    """bench/rerun_alarms.py's reruns through the deployment cost ~40 min (their parts are tested in
    tests/flows/); its --rejudge path runs here on the history it recorded on 2026-12-06 (real SmolLM2, the
    shipped drafter, vLLM CPU): this checkout's watch must still give the verdicts bench/RESULTS.md reports,
    no regression in the ten reruns of one drafter and a drafter regression for the worse one."""
    import gzip

    recorded = REPO / "bench" / "results" / "rerun-alarms-cpu-20261206"
    history = tmp_path / "history"
    history.mkdir()
    for f in (recorded / "history").glob("*.json.gz"):
        (history / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    out = tmp_path / "rejudged.json"
    _script("rerun_alarms.py", "--rejudge", str(history), "--out", str(out), timeout=300)
    verdicts = json.loads(out.read_text())["verdicts"]
    assert [v["status"] for v in verdicts] == [v["status"] for v in json.loads((recorded / "rejudged.json").read_text())["verdicts"]]
    assert verdicts[-1]["status"] == "drafter regression" and "drafter checksum" in verdicts[-1]["message"]
    assert not [v for v in verdicts[:-1] if v["status"] in ("drafter regression", "engine regression")]
