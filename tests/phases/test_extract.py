"""Phase 2 (hidden-state extraction): real vLLM CPU server in extract-hidden-states mode with the
pack's CPU connector, real `speculators prepare-data` / `generate-offline-data`, tiny 8-layer Llama.

The phase-1 output is written here directly in datagen's format (run_dir/datagen/samples.jsonl),
so these tests need no data-generation server. The integration test starts two servers in all:
the phase is killed mid-way (SIGKILL of `eagle3 extract`), then rerun after files were broken."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from eagle3.progress import counts, subscribed
from eagle3.process import procfs
from eagle3.errors import ConfigError
from eagle3.phases.extract import ExtractPaths, run_extract, stop_leftovers
from eagle3.phases.extract_disk import DiskSpaceError, check_disk, exact_estimate
from eagle3.phases.extract_manifest import ManifestError, read_extract_manifest, resolve_layer_plan
from eagle3.phase_runner import supervisor
from eagle3.process.services import LaunchSpec, Supervisor
from tests.ports import free_port
from tests.reliability.standins import mark_done

REPO = Path(__file__).resolve().parents[2]
ENGINE_PYTHON = REPO / ".venv-engine" / "bin" / "python"
EAGLE3 = REPO / ".venv" / "bin" / "eagle3"
CHECK_SCRIPT = Path(__file__).with_name("engine_check_extract.py")

TOPICS = ["binary search", "hash maps", "garbage collection", "TCP handshakes", "the CAP theorem", "B-trees",
          "mutexes", "DNS", "virtual memory", "bloom filters", "consistent hashing", "quicksort"]


def write_phase1(cfg, n: int) -> Path:
    """Rows as eagle3.phases.datagen.sample_row writes them; one conversation has two assistant
    turns (prepare-data emits one row per assistant turn)."""
    path = cfg.layout.samples
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n):
            topic = TOPICS[i % len(TOPICS)]
            user = f"Explain {topic} in two sentences (case {i})."
            answer = f"{topic.capitalize()} is a classic idea in computing. " * (1 + i % 3) + f"It matters in case {i}."
            conv = [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            if i == 1:
                conv = [conv[0], {"role": "assistant", "content": f"First answer about {topic}."},
                        {"role": "user", "content": "And in one word?"}, {"role": "assistant", "content": "Lookup."}]
            meta = {"line": i, "finish_reason": "stop", "reasoning": "", "prompt_tokens": len(user) // 3 + 6,
                    "completion_tokens": len(answer) // 3, "prompt_token_ids": [], "token_ids": []}
            fh.write(json.dumps({"id": f"x{i:03d}", "conversations": conv, "meta": meta}) + "\n")
    mark_done(cfg, "datagen")  # as after a real datagen run: `eagle3 extract` checks its upstream
    return path


@pytest.fixture
def extract_config(make_config, tiny_model):
    def _make(extract: dict | None = None, top: dict | None = None, **kw):
        return make_config({"target": {"model": str(tiny_model)},
                            "extract": {"server": {"port": free_port(), "startup_timeout_s": 600,
                                                   "hang_timeout_s": 300}, **(extract or {})}, **(top or {})}, **kw)
    return _make


def snapshot(directory: Path) -> dict[str, tuple[int, int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns, p.stat().st_size)
            for p in directory.glob("hs_*.safetensors")}


# ---- before anything starts ---------------------------------------------------------------------

def test_layer_id_out_of_range_is_a_config_error(extract_config, tmp_path):
    with pytest.raises(ConfigError) as err:
        extract_config({"aux_layer_ids": [2, 4, 8]})
    assert "extract.aux_layer_ids" in str(err.value) and "[8] out of range" in str(err.value)

    # Even when file checks were skipped at load time, the phase refuses before touching anything.
    cfg = extract_config({"aux_layer_ids": [2, 4, 8]}, check_files=False)
    write_phase1(cfg, 2)
    with pytest.raises(ConfigError, match=r"extract\.aux_layer_ids: \[2, 4, 8\] is \[8\] out of range"):
        run_extract(cfg, Supervisor(cfg.layout.state))
    assert not ExtractPaths.of(cfg).dir.exists()
    assert Supervisor(cfg.layout.state).registry.entries() == []


def test_default_layers_of_a_shallow_target_need_explicit_ids(make_config, tmp_path):
    model = tmp_path / "four-layers"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"extract\.aux_layer_ids: unset, and the default .* = \[2, 2, 1\]"):
        make_config({"target": {"model": str(model)}})  # `eagle3 validate` catches it
    cfg = make_config({"target": {"model": str(model)}}, check_files=False)
    with pytest.raises(ConfigError, match=r"default \(2, L//2, L-3\) = \[2, 2, 1\] is not distinct.*e\.g\. \[1, 2, 3\]"):
        resolve_layer_plan(cfg)  # and the phase itself, before anything starts
    plan = resolve_layer_plan(make_config({"target": {"model": str(model)}, "extract": {"aux_layer_ids": [1, 2, 3]}}))
    assert plan.layer_ids == (1, 2, 3, 4) and plan.source == "config"
    plan = resolve_layer_plan(make_config({"target": {"model": str(model)},
                                           "extract": {"aux_layer_ids": [0, 3], "include_last_layer": False}}))
    assert plan.layer_ids == (0, 3) and plan.last_layer_id is None


def test_default_layers_of_the_tiny_target(extract_config):
    plan = resolve_layer_plan(extract_config())
    assert (plan.num_hidden_layers, plan.hidden_size) == (8, 128)
    assert plan.aux_layer_ids == (2, 4, 5) and plan.last_layer_id == 8 and plan.source == "default"


def test_disk_limit_refuses_before_any_process(extract_config):
    # forced offline: the limit refuses (auto would go online, tests/phases/test_hs_mode.py)
    cfg = extract_config({"max_disk_bytes": 4096}, top={"hidden_states": {"mode": "offline"}})
    write_phase1(cfg, 12)
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        run_extract(cfg, Supervisor(cfg.layout.state))
    msg = str(err.value)
    # both numbers: the estimate (tokens x 4 layers x 128 x 4 bytes + 8) and the limit
    assert "extract.max_disk_bytes" in msg and "limit is 4096 bytes" in msg
    assert "× 2056 B/token" in msg
    estimated = int(msg.split("need ")[1].split(" bytes")[0])
    assert estimated > 4096
    assert time.monotonic() - t0 < 10
    paths = ExtractPaths.of(cfg)
    assert not paths.logs.exists() and not paths.hidden_states.exists()
    assert Supervisor(cfg.layout.state).registry.entries() == []


def test_free_space_refusal_names_both_numbers(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    too_big = exact_estimate(rows=10, tokens=free // 1000 + 1, per_token=1000)
    with pytest.raises(DiskSpaceError) as err:
        check_disk(too_big, 0, tmp_path / "hidden_states", limit=None)
    msg = str(err.value)
    assert f"still need {too_big.bytes} bytes" in msg and "bytes (" in msg.split("has only ")[1]
    check_disk(exact_estimate(rows=1, tokens=10, per_token=1000), 0, tmp_path / "hidden_states", limit=None)


def test_connector_choice_and_command_lines(tmp_path):
    from eagle3.config import EngineEnv
    from eagle3.engines import hidden_states, speculators_cli as speculators

    def flags(argv):
        return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}

    cpu = flags(hidden_states.server_args([2, 4, 5, 8], tmp_path / "staging", cpu=True))
    gpu = flags(hidden_states.server_args([2, 4, 5, 8], tmp_path / "staging", cpu=False))
    for f in (cpu, gpu):
        spec = json.loads(f["--speculative-config"])
        assert spec["method"] == "extract_hidden_states"
        assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5, 8]
        assert json.loads(f["--kv-transfer-config"])["kv_connector_extra_config"]["shared_storage_path"] == \
            str(tmp_path / "staging")
    assert json.loads(cpu["--kv-transfer-config"])["kv_connector"] == "CpuHiddenStatesConnector"
    assert json.loads(cpu["--kv-transfer-config"])["kv_connector_module_path"] == "cpu_hidden_states_connector"
    assert json.loads(gpu["--kv-transfer-config"]) == {
        "kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path / "staging")}}
    assert hidden_states.server_env(False, {}) == {}
    path = hidden_states.server_env(True, {"PYTHONPATH": "/x"})["PYTHONPATH"].split(os.pathsep)
    assert path == [str(hidden_states.ENGINE_SIDE_DIR), "/x"]
    assert (hidden_states.ENGINE_SIDE_DIR / "cpu_hidden_states_connector.py").is_file()

    env = EngineEnv(python=Path("/venv/bin/python"))
    prep = speculators.prepare_data_argv(env, Path("/m"), Path("/d.jsonl"), Path("/o"), 512, "http://h:1/")
    assert prep[:2] == ["/venv/bin/speculators", "prepare-data"] and flags(prep)["--render-endpoint"] == "http://h:1"
    assert "--no-skip-token-freq" in prep
    gen = speculators.generate_offline_data_argv(env, "http://h:1/v1", Path("/o"), Path("/o/hs"), 4, served_name="t")
    assert flags(gen)["--model"] == "t" and "--fail-on-error" in gen and "--validate-outputs" in gen


# ---- the real thing ------------------------------------------------------------------------------

def engine_check(cfg, manifest) -> dict:
    argv = [str(ENGINE_PYTHON), str(CHECK_SCRIPT), str(cfg.target.model), manifest.prepared_data,
            manifest.hidden_states_dir, str(cfg.layout.samples), json.dumps(manifest.layer_ids)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.engine
def test_extract_kill_resume_and_repair(extract_config, tmp_path):
    n_conv = 20
    cfg = extract_config({"concurrency": 1})
    write_phase1(cfg, n_conv)
    paths = ExtractPaths.of(cfg)
    config_file = tmp_path / "config.yaml"  # written by make_config

    # Run 1: the CLI, killed with SIGKILL once a few files exist (its server and client are orphaned).
    test_sup = Supervisor(tmp_path / "test-state")
    t0 = time.monotonic()
    cli = test_sup.launch(LaunchSpec(name="eagle3-extract", argv=[str(EAGLE3), "extract", str(config_file)],
                                     log=tmp_path / "cli.log"))
    try:
        deadline = time.monotonic() + 780
        while len(list(paths.hidden_states.glob("hs_*.safetensors"))) < 3:
            assert cli.poll() is None, f"eagle3 extract exited early:\n{cli.log_tail()}"
            assert time.monotonic() < deadline, f"no hidden-state files:\n{cli.log_tail()}"
            time.sleep(0.02)
        os.kill(cli.pid, signal.SIGKILL)
        cli.popen.wait(timeout=10)
    finally:
        cli.stop()
    run1_s = time.monotonic() - t0

    # What the killed run left behind is recorded and is ended by the phase's own cleanup (a rerun
    # does this first); the server's port is free again.
    sup = supervisor(cfg)
    names = {e.name for e in sup.registry.entries()}
    assert "extract-vllm-server" in names and "extract-generate-offline-data" in names
    stopped = stop_leftovers(cfg, sup)
    assert any(o.name == "extract-vllm-server" and o.members for o in stopped)
    assert all(o.clean for o in stopped) and sup.registry.entries() == []
    assert not procfs.listening_ports({cfg.extract.server.port})

    index = json.loads(paths.index.read_text())
    n = index["num_samples"]
    assert n == n_conv + 1  # the two-turn conversation gives two rows
    before = snapshot(paths.hidden_states)
    assert 3 <= len(before) < n, f"expected a partial run, found {len(before)} of {n} files"

    # Break two finished files: one truncated (an interrupted copy), one holding another sample.
    names = sorted(before, key=lambda s: int(s[3:-12]))
    truncated, swapped, donor = names[0], names[1], names[2]
    with open(paths.hidden_states / truncated, "r+b") as fh:
        fh.truncate(before[truncated][2] // 2)
    (paths.hidden_states / swapped).write_bytes((paths.hidden_states / donor).read_bytes())
    kept = {k: v for k, v in snapshot(paths.hidden_states).items() if k not in (truncated, swapped)}

    # Run 2, in-process: keeps the valid files untouched, regenerates the two broken and the missing ones.
    # (Concurrency does not change the output, so the resume may use another value.)
    cfg = extract_config({"concurrency": 4}, run_dir=cfg.run_dir)
    sup = supervisor(cfg)
    progress: list[tuple[int, int]] = []
    t1 = time.monotonic()
    try:
        with subscribed(counts("extract", lambda d, t: progress.append((d, t)))):
            summary = run_extract(cfg, sup)
    finally:
        sup.stop_all()
    run2_s = time.monotonic() - t1
    got = summary.details
    assert got["samples"] == n and got["server_started"] and got["prepared_reused"]
    assert got["kept_files"] == len(kept) and got["redone_files"] == 2
    assert got["new_files"] == n - len(kept)
    after = snapshot(paths.hidden_states)
    assert sorted(after, key=lambda s: int(s[3:-12])) == [f"hs_{i}.safetensors" for i in range(n)]
    for name, ident in kept.items():
        assert after[name] == ident, f"{name} was rewritten although it was valid"
    assert after[truncated][2] == before[truncated][2]  # full size again
    assert progress and progress[-1] == (n, n)
    assert sup.registry.entries() == []  # server and clients stopped
    assert not paths.staging.exists()

    # The manifest pins the layers and their convention; later phases read it back.
    manifest = read_extract_manifest(cfg)
    assert manifest.layer_ids == [2, 4, 5, 8] and manifest.target_layer_ids == [2, 4, 5]
    assert manifest.last_layer_id == 8 and manifest.layer_id_convention == "vllm"
    assert manifest.num_samples == n and manifest.total_tokens == sum(index["seq_len"])
    assert manifest.dtype == "float32" and manifest.hidden_size == 128
    assert manifest.token_freq and Path(manifest.token_freq).is_file()
    assert manifest.total_bytes == sum(v[2] for v in after.values())
    raw = json.loads(paths.manifest.read_text())
    assert raw["layer_ids"] == [2, 4, 5, 8] and "entering decoder layer k" in raw["convention_note"]

    # Independent check with torch/safetensors/datasets/transformers in the engine interpreter.
    check = engine_check(cfg, manifest)
    assert check["num_prepared"] == n
    for i, f in enumerate(check["files"]):
        assert f["keys"] == ["hidden_states", "token_ids"]
        assert f["shape"] == [index["seq_len"][i], 4, 128] and f["dtype"] == "float32"
        assert f["token_ids_dtype"] == "int64"
    assert all(check["ids_match"]), "token ids differ from the prepared input_ids"
    assert all(check["finite"])
    assert all(m >= 1 for m in check["phase1_matches"]) and all(check["finals_found"])
    # Files hold exactly the configured layers: HF hidden_states[k] for aux ids, pre-norm output for L.
    assert max(check["layer_max_abs_diff"]) < 1e-3, check["layer_max_abs_diff"]
    assert check["off_by_one_diff"] > 1e-2

    # A finished phase reruns without a server and without touching a file.
    again = run_extract(cfg, sup)
    got = again.details
    assert not got["server_started"] and got["kept_files"] == n and got["new_files"] == 0
    assert snapshot(paths.hidden_states) == after

    # Later phases cannot silently use other layers, and changed settings are refused up front.
    other = extract_config({"aux_layer_ids": [1, 3, 5]}, run_dir=cfg.run_dir)
    with pytest.raises(ManifestError, match=r"hold layers \[2, 4, 5, 8\].*resolves .* to \[1, 3, 5, 8\]"):
        read_extract_manifest(other)
    with pytest.raises(ConfigError, match=r"other settings \(changed: layer_ids\)"):
        run_extract(other, supervisor(other))
    print(f"\nextract timings: killed run {run1_s:.0f} s, resumed run {run2_s:.0f} s, {n} samples")


@pytest.mark.slow
@pytest.mark.engine
def test_extraction_from_a_data_parallel_server_writes_the_targets_own_hidden_states(make_config, tiny_model):
    """target.data_parallel_size 2 (issue 40: extraction on both GPUs of a node whose target does not split
    over them) on vLLM's CPU build: the extraction server runs two copies of the target, and every file holds
    what Hugging Face's model computes for its sample, checked independently in the engine's interpreter."""
    from tests.conftest import TEST_VLLM_INPROC_WORKER

    cfg = make_config({"target": {"model": str(tiny_model), "data_parallel_size": 2},
                       "engines": {"vllm": {"env": {TEST_VLLM_INPROC_WORKER: "1"}}},  # a process per copy
                       "extract": {"concurrency": 4, "server": {"port": free_port(), "startup_timeout_s": 600,
                                                                "hang_timeout_s": 300}}})
    write_phase1(cfg, 8)
    sup = supervisor(cfg)
    summary = run_extract(cfg, sup)
    manifest = read_extract_manifest(cfg)
    n = manifest.num_samples
    assert summary.details["new_files"] == n == 9 and len(list(ExtractPaths.of(cfg).hidden_states.glob("hs_*"))) == n
    log = (cfg.phase_dir("extract") / "logs" / "vllm-server.log").read_text(errors="replace")
    assert "EngineCore_DP0" in log and "EngineCore_DP1" in log
    check = engine_check(cfg, manifest)
    assert check["num_prepared"] == n and all(check["ids_match"]) and all(check["finite"])
    assert max(check["layer_max_abs_diff"]) < 1e-3, check["layer_max_abs_diff"]
    assert sup.registry.entries() == [] and not procfs.listening_ports({cfg.extract.server.port})
