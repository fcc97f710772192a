"""Preflight doctor: each check with real inputs (real engine probes where the check needs one)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3.cli import app
from eagle3.doctor import (FAIL, PASS, WARN, check_aux_layers, check_disk, check_network_exposure, check_ports, check_target_support,
                           check_tensor_parallel, run_doctor)
from eagle3.process.services import Supervisor
from eagle3.phases.train_manifest import MANIFEST_SCHEMA

from tests.conftest import requires_engine

runner = CliRunner()


def _fake_target(tmp_path: Path, name: str, config: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.fixture
def cfg(make_config, tiny_model):
    return make_config()


def test_aux_layers_default_pass(cfg):
    c = check_aux_layers(cfg)
    assert c.status == PASS and "[2, 4, 5]" in c.reason


def test_aux_layers_mismatch_with_extract_manifest_fails(cfg):
    manifest = cfg.phase_dir("extract") / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"aux_layer_ids": [1, 4, 5, 8], "include_last_layer": True}))
    c = check_aux_layers(cfg)
    assert c.status == FAIL and "[1, 4, 5]" in c.reason and "[2, 4, 5]" in c.reason


def test_a_server_open_to_the_network_is_a_warning(make_config, tiny_model):
    assert check_network_exposure(make_config()).status == PASS
    cfg = make_config({"bench": {"server": {"host": "0.0.0.0", "allow_remote": True}},
                       "engines": {"vllm": {"env": {"VLLM_HOST_IP": "10.1.2.3"}}}})
    c = check_network_exposure(cfg)
    assert c.status == WARN and "bench.server.host is 0.0.0.0" in c.reason and "without an api_key" in c.reason
    assert "engines.vllm.env.VLLM_HOST_IP" in c.reason and "127.0.0.1" in c.fix


def test_disk_limit_too_small_fails(make_config, tiny_model):
    cfg = make_config({"extract": {"max_disk_bytes": 1000}})
    c = check_disk(cfg)
    assert c.status == FAIL and "max_disk_bytes" in c.reason


def test_busy_port_fails(make_config, tiny_model):
    from tests.ports import free_port

    cfg = make_config({"bench": {"server": {"port": free_port()}}, "datagen": {"server": {"port": free_port()}},
                       "extract": {"server": {"port": free_port()}}})
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", cfg.bench.server.port))
        s.listen()
        c = check_ports(cfg)
    assert c.status == FAIL and str(cfg.bench.server.port) in c.reason
    assert check_ports(cfg).status == PASS


def test_port_check_names_listeners_and_tells_own_leftovers_from_foreign(make_config, spawner, tmp_path):
    from eagle3.process import procfs
    from eagle3.process.services import LaunchSpec, Supervisor, state_dir_for
    from tests.ports import free_port
    from tests.procutil import LISTEN, PY, wait_until

    cfg = make_config({"bench": {"server": {"port": free_port()}}, "datagen": {"server": {"port": free_port()}},
                       "extract": {"server": {"port": free_port()}}}, check_files=False)
    stranger = spawner.start(LISTEN, cfg.datagen.server.port)
    sup = Supervisor(state_dir_for(cfg.run_dir))
    leftover = sup.launch(LaunchSpec(name="extract-vllm-server", argv=[PY, "-c", LISTEN, str(cfg.extract.server.port)],
                                     log=tmp_path / "leftover.log", phase="extract", stop_grace_s=2))
    try:
        wait_until(lambda: procfs.listening_ports({cfg.extract.server.port}), what="the leftover listener")
        c = check_ports(cfg)
        assert c.status == FAIL and f"{cfg.datagen.server.port} (PID {stranger.pid}:" in c.reason
        assert "not started by this pipeline" in c.reason and str(leftover.pid) not in c.reason
        stranger.kill()
        stranger.wait()
        c = check_ports(cfg)
        assert c.status == WARN and f"{cfg.extract.server.port} (PID {leftover.pid}:" in c.reason
        assert "recovery handoff" in c.fix
        assert leftover.poll() is None, "the doctor only looks"
    finally:
        sup.stop_all()


@pytest.mark.slow
@pytest.mark.engine
@requires_engine
def test_target_support_real_vllm(make_config, tiny_model, tmp_path):
    """One engine probe per target: the tiny Llama passes; GPT-2 (no SupportsEagle3 in vLLM) fails by
    name (F1/F3); a Kimi-K2.5 config without media_placeholder_token_id fails the F2 check."""
    cfg = make_config()
    sup = Supervisor(cfg.run_dir / "state")
    t0 = time.monotonic()
    ok = {c.name: c for c in check_target_support(cfg, sup, "vllm")}
    assert ok["target-support:vllm"].status == PASS, ok
    assert ok["target-config:vllm"].status == PASS

    gpt2 = _fake_target(tmp_path, "gpt2", {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
                                           "num_hidden_layers": 8})
    bad = {c.name: c for c in check_target_support(make_config({"target": {"model": str(gpt2)}}, run_dir=tmp_path / "r2"),
                                                   sup, "vllm")}
    assert bad["target-support:vllm"].status == FAIL and "GPT2LMHeadModel" in bad["target-support:vllm"].reason

    kimi = _fake_target(tmp_path, "kimi", {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                                           "text_config": {"num_hidden_layers": 8, "hidden_size": 64}})
    k = {c.name: c for c in check_target_support(make_config({"target": {"model": str(kimi)}}, run_dir=tmp_path / "r3"),
                                                 sup, "vllm")}
    assert k["target-support:vllm"].status == PASS
    assert k["target-config:vllm"].status == FAIL and "media_placeholder_token_id" in k["target-config:vllm"].reason
    assert time.monotonic() - t0 < 300  # seconds, not a 30-minute load


@pytest.mark.slow
@pytest.mark.engine
@requires_engine
def test_doctor_cli_on_tiny_config_passes_and_caches(make_config, tmp_path):
    cfg = make_config()
    path = tmp_path / "config.yaml"
    first = runner.invoke(app, ["doctor", str(path), "--json"])
    assert first.exit_code == 0, first.output
    checks = json.loads(first.output)
    assert {c["status"] for c in checks} == {PASS}
    assert {"gpus", "ports", "shm", "disk", "aux-layers", "engine-env:vllm", "target-support:vllm",
            "load-generator:vllm"} <= {c["name"] for c in checks}
    t0 = time.monotonic()
    again = runner.invoke(app, ["doctor", str(path), "--json"])
    assert again.exit_code == 0 and time.monotonic() - t0 < 10  # engine answers come from the run dir's cache
    assert (cfg.run_dir / "doctor" / "report.json").exists()


def test_doctor_exit_1_on_fail(make_config, tmp_path, tiny_model):
    make_config({"extract": {"max_disk_bytes": 10}})
    result = runner.invoke(app, ["doctor", str(tmp_path / "config.yaml"), "--no-engines"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "disk" in result.output


def test_run_doctor_without_engines_lists_every_static_check(cfg):
    names = [c.name for c in run_doctor(cfg, engines=False)]
    assert names[:6] == ["gpus", "model-files", "ports", "shm", "disk", "aux-layers"]


def test_model_dir_without_weights_fails(make_config, tmp_path):
    from eagle3.doctor import check_model_files

    model = _fake_target(tmp_path, "noweights", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8,
                                                 "hidden_size": 64})
    c = check_model_files(make_config({"target": {"model": str(model)}}))
    assert c.status == FAIL and "no weight files" in c.reason
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-00001.safetensors"}}))
    (model / "model-00002.safetensors").write_bytes(b"x")
    c = check_model_files(make_config({"target": {"model": str(model)}}))
    assert c.status == FAIL and "model-00001.safetensors" in c.reason


def _train_manifest(cfg, checkpoint: Path, ids: list[int]) -> None:
    path = cfg.phase_dir("train") / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": MANIFEST_SCHEMA, "checkpoint": str(checkpoint), "trained": True, "aux_layer_ids_vllm": ids}))


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "eagle3-tiny"


@pytest.mark.skipif(not (FIXTURE / "drafter-trained").is_dir(), reason="trained drafter fixture missing")
def test_drafter_bound_for_sglang_fails_and_vllm_passes(make_config, tmp_path):
    """F7: a speculators-format drafter (layers.0.*) for an SGLang that wants midlayer.* is caught."""
    from eagle3.doctor import check_drafter

    overrides = {"target": {"model": str(FIXTURE / "target")}}
    cfg = make_config(overrides)
    ids = json.loads((FIXTURE / "drafter-trained" / "config.json").read_text()).get("eagle_aux_hidden_state_layer_ids")
    _train_manifest(cfg, FIXTURE / "drafter-trained", ids)
    assert check_drafter(cfg).status == PASS, check_drafter(cfg).reason
    sg = make_config({**overrides, "engines": {"sglang": {"python": "/usr/bin/python3"}}, "bench": {"engine": "sglang"}},
                     run_dir=cfg.run_dir)
    c = check_drafter(sg)
    assert c.status == FAIL, c
    assert "midlayer" in c.reason and "export-drafter" in c.fix, c


def test_a_load_generator_that_fails_at_import_is_caught_before_any_server(make_config, tmp_path):
    """SGLang's bench_serving imported HF datasets, which its server never needs: on the H200 the
    benchmark failed only once its baseline server was up. The doctor imports the load generator in
    the engine's own environment, names the missing module, and does not keep the failure: once the
    module is installed the next doctor run passes."""
    import sys

    from eagle3.doctor import check_load_generator

    site = tmp_path / "sglang-env"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / "sglang" / "bench_serving.py").write_text("import eagle3_test_hf_datasets  # SGLang's MMMU loader\n")
    cfg = make_config({"target": {"model": str(FIXTURE / "target")}, "bench": {"engine": "sglang"},
                       "engines": {"sglang": {"python": sys.executable, "env": {"PYTHONPATH": str(site)}},
                                   "vllm": {"python": sys.executable}, "speculators": {"python": sys.executable}}})
    sup = Supervisor(cfg.run_dir / "state")
    c = check_load_generator(cfg, sup)
    assert c.status == FAIL and c.name == "load-generator:sglang", c
    assert "sglang.bench_serving" in c.reason and "No module named 'eagle3_test_hf_datasets'" in c.reason, c
    assert "`eagle3_test_hf_datasets`" in c.fix and "engines.sglang" in c.fix, c
    assert any(x.name == "load-generator:sglang" and x.status == FAIL for x in run_doctor(cfg, sup))

    (site / "eagle3_test_hf_datasets.py").write_text("")  # the missing package installed
    c = check_load_generator(cfg, sup)
    assert c.status == PASS and "sglang.bench_serving" in c.reason, c


def test_target_without_architectures_names_the_file_the_field_and_the_fix(make_config, tiny_model, tmp_path):
    """A config.json converted from a GGUF has no `architectures`: the doctor says which file, which field
    and what to add, before it spends an engine probe on it (the probe said only 'no model class for []')."""
    target = _fake_target(tmp_path, "from-gguf", {"model_type": "llama", "num_hidden_layers": 8})
    cfg = make_config({"target": {"model": str(target)}}, run_dir=tmp_path / "run")
    sup = Supervisor(cfg.run_dir / "state")
    t0 = time.monotonic()
    [c] = check_target_support(cfg, sup, "vllm")
    assert time.monotonic() - t0 < 5  # no engine was probed
    assert c.status == FAIL and c.name == "target-support:vllm"
    assert f"{target}/config.json" in c.reason and "`architectures`" in c.reason
    assert '"architectures": ["LlamaForCausalLM"]' in c.fix and f"{target}/config.json" in c.fix
    other = _fake_target(tmp_path, "odd", {"model_type": "odd_arch", "architectures": [], "num_hidden_layers": 8})
    [c] = check_target_support(make_config({"target": {"model": str(other)}}, run_dir=tmp_path / "r2"), sup, "vllm")
    assert c.status == FAIL and "<ModelClass>" in c.fix and "'odd_arch'" in c.fix


@pytest.mark.parametrize("heads, kv, tp, gpus, status, sizes, copies", [
    (9, 3, 2, 2, FAIL, "1", 2),       # SmolLM2-135M on two GPUs: 9 query heads do not halve; two copies of TP 1
    (9, 3, 2, 4, FAIL, "1 or 3", None),
    (9, 3, 3, 3, PASS, None, None),
    (32, 8, 4, 4, PASS, None, None),
    (32, 8, 16, 16, PASS, None, None),  # fewer KV heads than ranks: each replicated twice
    (32, 6, 4, 4, FAIL, "1 or 2", 2),   # 6 KV heads: neither divided by 4 nor dividing it
    (12, 3, 4, 4, FAIL, "1 or 3", None),  # 4 ranks on 3 KV heads: no whole replication
])
def test_a_tensor_parallel_size_the_heads_cannot_be_split_by_is_refused_naming_the_sizes_that_can(
        make_config, tmp_path, heads, kv, tp, gpus, status, sizes, copies):
    target = _fake_target(tmp_path, "t", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8,
                                          "num_attention_heads": heads, "num_key_value_heads": kv})
    cfg = make_config({"target": {"model": str(target), "tensor_parallel_size": tp}, "gpus": list(range(gpus))},
                      run_dir=tmp_path / "run")
    c = check_tensor_parallel(cfg)
    assert c.status == status, c
    if status == FAIL:
        assert "target.tensor_parallel_size" in c.reason and f"{target}/config.json" in c.reason
        assert f"{heads} query / {kv} KV heads" in c.reason and f"set target.tensor_parallel_size to {sizes} " in c.fix
        # every GPU still used, as copies of the largest size that splits: or nothing said where none is left over
        assert (f"target.data_parallel_size: {copies}" in c.fix) if copies else "data_parallel_size" not in c.fix


def test_tensor_parallel_one_needs_no_check_and_unknown_heads_only_warn(make_config, tmp_path):
    target = _fake_target(tmp_path, "t", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8})
    assert check_tensor_parallel(make_config({"target": {"model": str(target)}}, run_dir=tmp_path / "a")) is None
    c = check_tensor_parallel(make_config({"target": {"model": str(target), "tensor_parallel_size": 2}, "gpus": [0, 1]},
                                          run_dir=tmp_path / "b"))
    assert c.status == WARN and "num_attention_heads" in c.reason


def test_the_warm_up_asks_each_engine_probe_at_once_and_the_preflight_then_asks_nothing(make_config, tmp_path,
                                                                                        monkeypatch):
    """Issue 39: on the H200 machine the preflight's probes (each an engine interpreter importing its
    engine, 17-21 s there) ran one after another while the run's Prefect server started, and held the
    first phase ~40 s. The warm-up now runs each group of checks that shares a probe in a thread of its
    own: every probe's interpreter is alive at the same moment. The interpreter here is a wrapper that
    records when each probe ran and then runs the real engine interpreter (the probes' answers are real)."""

    from eagle3.doctor import engine_check_groups, warm_engine_probes
    from tests.conftest import ENGINE_PYTHON, engine_available

    if not engine_available():
        pytest.skip("engine venv missing: run `make engine-env`")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no answer of an earlier test's
    spans = tmp_path / "spans"
    wrapper = tmp_path / "engine-bin" / "python"
    wrapper.parent.mkdir()
    # It stays up 2 s before the real interpreter runs, so probes that run one after another cannot overlap.
    wrapper.write_text(f'#!/bin/sh\necho "start $$ $(date +%s.%N) $*" >> {spans}\nsleep 2\n'
                       f'{ENGINE_PYTHON} "$@"; rc=$?\necho "end $$ $(date +%s.%N)" >> {spans}\nexit $rc\n')
    wrapper.chmod(0o755)
    cfg = make_config({"engines": {"vllm": {"python": str(wrapper)}, "speculators": {"python": str(wrapper)}}},
                      run_dir=tmp_path / "run")
    groups = engine_check_groups(cfg, Supervisor(cfg.layout.state))
    assert len(groups) >= 3  # vLLM's inspection, its load generator, the trainer's versions

    warm_engine_probes(cfg).join()
    lines = [line.split() for line in spans.read_text().splitlines()]
    starts = {pid: float(t) for kind, pid, t, *_ in lines if kind == "start"}
    ends = {pid: float(t) for kind, pid, t, *_ in lines if kind == "end"}
    assert len(starts) == len(groups) and set(ends) == set(starts), lines  # one probe per group, each ended
    assert max(starts.values()) < min(ends.values()), "every probe was running at one moment"

    checks = run_doctor(cfg)  # the preflight: every engine answer from the cache, no interpreter started
    assert len(spans.read_text().splitlines()) == 2 * len(groups)
    engine_names = {"engine-env:vllm", "target-support:vllm", "load-generator:vllm", "trainer-kernels"}
    assert {c.name for c in checks if c.name in engine_names} == engine_names
    assert all(c.status == PASS for c in checks if c.name in engine_names), [(c.name, c.reason) for c in checks]
