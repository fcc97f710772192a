"""The pack's compile cache (eagle3/engines/compile_cache.py): one directory per key, and a key that
changes with the model, the engine's version, the server's flags and the GPU, never with where the
server listens or what it is called."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from eagle3.engines import compile_cache as cc
from eagle3.engines.vllm import ENGINE as VLLM

VERSIONS = {"vllm": "0.25.0", "torch": "2.11.0"}


def make_model(path: Path, layers: int = 8) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path


def argv(model: Path, *extra: str, port: int = 8000, name: str = "m", host: str = "127.0.0.1") -> list[str]:
    return ["/venv/bin/vllm", "serve", str(model), "--served-model-name", name, "--host", host,
            "--port", str(port), "--dtype", "bfloat16", *extra]


def key(model: Path, args: list[str], versions=VERSIONS, env=None, gpus=("NVIDIA H200",)) -> str:
    return cc.cache_key(cc.key_material("vllm", versions, args, env or {}, model, list(gpus)))


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path / "model")


def test_where_it_listens_and_its_name_do_not_change_the_key(model):
    assert key(model, argv(model)) == key(model, argv(model, port=9000, name="other", host="0.0.0.0"))
    assert key(model, argv(model, "--port=1")) == key(model, argv(model, "--port=2"))


@pytest.mark.parametrize("change", ["flag", "flag value", "version", "engine env", "gpu"])
def test_the_key_changes_with_what_a_compile_depends_on(model, change):
    base = key(model, argv(model, "--max-num-seqs", "256"))
    other = {
        "flag": lambda: key(model, argv(model, "--max-num-seqs", "256", "--enforce-eager")),
        "flag value": lambda: key(model, argv(model, "--max-num-seqs", "512")),
        "version": lambda: key(model, argv(model, "--max-num-seqs", "256"), versions={**VERSIONS, "vllm": "0.32.0"}),
        "engine env": lambda: key(model, argv(model, "--max-num-seqs", "256"), env={"VLLM_USE_V2": "0"}),
        "gpu": lambda: key(model, argv(model, "--max-num-seqs", "256"), gpus=("NVIDIA H100",)),
    }[change]()
    assert other != base


def test_another_model_or_a_remade_one_is_another_key(tmp_path, model):
    before = key(model, argv(model))
    assert key(make_model(tmp_path / "deeper", layers=30), argv(model)) != before  # same path in argv, other config
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 9}))
    edited = key(model, argv(model))
    assert edited != before
    (model / "model.safetensors").write_bytes(b"\1" * 65)  # rewritten weights: size and mtime
    assert key(model, argv(model)) != edited


def test_a_drafter_named_in_a_json_flag_is_part_of_the_key(tmp_path, model):
    drafter = make_model(tmp_path / "drafter", layers=1)
    spec = argv(model, *VLLM.spec_args(drafter, 3))
    before = key(model, spec)
    (drafter / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert key(model, spec) != before
    assert key(model, argv(model, *VLLM.spec_args(drafter, 4))) != key(model, spec)


def test_a_key_is_reused_only_after_a_start_finished_with_it(tmp_path, model):
    material = cc.key_material("vllm", VERSIONS, argv(model), {}, model, [])
    first = cc.prepare(tmp_path / "cache", "vllm", material, tmp_path / "scratch")
    assert not first.reused and first.path.parent == tmp_path / "cache" / "vllm"
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o700
    first.close(ready=False)  # the first start failed before it was ready
    again = cc.prepare(tmp_path / "cache", "vllm", material, tmp_path / "scratch")
    assert again.path == first.path and not again.reused
    again.close(ready=True)
    third = cc.prepare(tmp_path / "cache", "vllm", material, tmp_path / "scratch")
    assert third.reused and json.loads((third.path / cc.KEY_FILE).read_text()) == material
    other = cc.key_material("vllm", {**VERSIONS, "vllm": "0.32.0"}, argv(model), {}, model, [])
    assert not cc.prepare(tmp_path / "cache", "vllm", other, tmp_path / "scratch").reused


def test_a_second_start_of_a_key_in_use_compiles_apart_until_the_first_releases_it(tmp_path, model):
    """Two shards on one node starting the same server: the second must not write into the directory the
    first is compiling into; it compiles in its own scratch dir, reusing nothing, and says so."""
    material = cc.key_material("vllm", VERSIONS, argv(model), {}, model, [])
    first = cc.prepare(tmp_path / "cache", "vllm", material, tmp_path / "scratch-a")
    second = cc.prepare(tmp_path / "cache", "vllm", material, tmp_path / "scratch-b")
    assert second.busy and second.path == tmp_path / "scratch-b" and not second.reused
    assert second.record()["busy"] is True and first.record()["busy"] is False
    second.close(ready=True)  # a scratch dir is never marked: nothing there outlives this start
    assert not (second.path / cc.KEY_FILE).exists()
    first.close(ready=True)
    third = cc.prepare(tmp_path / "cache", "vllm", material, tmp_path / "scratch-c")
    assert third.path == first.path and third.reused and not third.busy
    third.close(ready=True)
    third.close(ready=True)  # twice is harmless


def test_without_a_probed_version_a_start_compiles_in_an_emptied_scratch_dir(tmp_path):
    scratch = tmp_path / "run" / "state" / "compile-scratch" / "bench-vllm-server"
    scratch.mkdir(parents=True)
    (scratch / "stale").write_text("from an earlier start")
    cache = cc.prepare(tmp_path / "cache", "vllm", None, scratch)
    assert cache.path == scratch and not cache.reused and list(scratch.iterdir()) == []
    assert not (tmp_path / "cache").exists()


def test_a_cache_root_another_user_could_write_is_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "eagle3").mkdir(parents=True)
    assert cc.user_root() == tmp_path / "xdg" / "eagle3" / "compile"
    os.chmod(tmp_path / "xdg" / "eagle3", 0o777)
    assert cc.user_root() is None  # the run dir's state/compile-cache is used instead


def test_vllm_points_every_compile_cache_at_the_key_dir(tmp_path):
    env = VLLM.compile_cache_env(tmp_path)
    assert env == {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                   "TRITON_CACHE_DIR": str(tmp_path / "triton")}


def test_a_config_that_also_sets_a_cache_variable_is_refused_naming_the_switch(tmp_path):
    from tests.conftest import write_tiny_config
    from eagle3.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        write_tiny_config(tmp_path / "a", {"engines": {"vllm": {"env": {"VLLM_CACHE_ROOT": "/tmp/x"}}}})
    assert "engines.vllm.env.VLLM_CACHE_ROOT" in str(err.value) and "compile_cache: false" in str(err.value)
    cfg = write_tiny_config(tmp_path / "b", {"engines": {"vllm": {"compile_cache": False,
                                                                  "env": {"VLLM_CACHE_ROOT": "/tmp/x"}}}})
    assert cfg.engines.vllm.env["VLLM_CACHE_ROOT"] == "/tmp/x"


def test_vllm_s_model_inspection_answers_are_shared_by_every_key_of_one_engine_version(tmp_path, model):
    """vLLM keys its modelinfos by the model class's source file, not by the flags: two keys of one vLLM
    version (other flags) see the same answers; another version gets a directory of its own."""
    starts = []
    for versions, extra in [(VERSIONS, ()), (VERSIONS, ("--max-model-len", "512")), ({**VERSIONS, "vllm": "0.32.0"}, ())]:
        cache = cc.prepare(tmp_path / "cache", "vllm", cc.key_material("vllm", versions, argv(model, *extra), {}, model, []),
                           tmp_path / "scratch")
        VLLM.share_across_keys(cache.path, cache.shared)
        VLLM.share_across_keys(cache.path, cache.shared)  # the next start of the key finds the link in place
        starts.append(cache)
    first, other_flags, other_version = starts
    # A key's own answers from before they were shared are merged in.
    older = cc.prepare(tmp_path / "cache", "vllm", cc.key_material("vllm", VERSIONS, argv(model, "--seed", "1"), {}, model, []),
                       tmp_path / "scratch")
    (older.path / "vllm" / "modelinfos").mkdir(parents=True)
    (older.path / "vllm" / "modelinfos" / "qwen-def.json").write_text("{}")
    VLLM.share_across_keys(older.path, older.shared)
    assert (first.shared / "modelinfos" / "qwen-def.json").is_file() and (older.path / "vllm" / "modelinfos").is_symlink()
    older.close(ready=True)
    assert first.path != other_flags.path and first.shared == other_flags.shared != other_version.shared
    infos = Path(VLLM.compile_cache_env(first.path)["VLLM_CACHE_ROOT"]) / "modelinfos"
    (infos / "llama-abc.json").write_text("{}")  # what vLLM writes after its first inspection
    assert (Path(VLLM.compile_cache_env(other_flags.path)["VLLM_CACHE_ROOT"]) / "modelinfos" / "llama-abc.json").is_file()
    assert not (Path(VLLM.compile_cache_env(other_version.path)["VLLM_CACHE_ROOT"]) / "modelinfos" / "llama-abc.json").exists()
    assert stat.S_IMODE((first.shared / "modelinfos").stat().st_mode) == 0o700
    for cache in starts:
        cache.close(ready=True)
