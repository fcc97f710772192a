"""The tiny Llama builder: the model has the intended shape, builds are byte-identical, the
constant variant differs only in the final norm, and a failed build leaves nothing behind."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3.cli import app
from eagle3.config import EngineEnv
from eagle3.errors import CommandFailed
from eagle3.safetensors_header import read_header
from eagle3.tinymodel import REQUIRED_FILES, STAMP, TinyModelSpec, ensure_tiny_model, is_current, make_tiny_model

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tensor_bytes(path: Path) -> dict[str, bytes]:
    header = read_header(path)
    data = path.read_bytes()
    return {name: data[t.begin:t.end] for name, t in header.tensors.items()}


@pytest.mark.engine
def test_model_has_the_intended_shape(tiny_model):
    cfg = json.loads((tiny_model / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]) == (8, 128, 256)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (4, 2, 4096)
    assert cfg["tie_word_embeddings"] is False
    n = cfg["num_hidden_layers"]
    assert len({2, n // 2, n - 3}) == 3, "vLLM's default EAGLE-3 aux layers must be distinct"

    header = read_header(tiny_model / "model.safetensors")
    assert {t.dtype for t in header.tensors.values()} == {"F32"}
    assert {int(k.split(".")[2]) for k in header.tensors if k.startswith("model.layers.")} == set(range(8))
    assert header.tensors["model.embed_tokens.weight"].shape == (4096, 128)
    assert header.tensors["lm_head.weight"].shape == (4096, 128)
    assert header.tensors["model.layers.0.self_attn.k_proj.weight"].shape == (2 * 32, 128)
    weights = tensor_bytes(tiny_model / "model.safetensors")
    assert weights["lm_head.weight"] != weights["model.embed_tokens.weight"], "embeddings must be untied"

    tok = json.loads((tiny_model / "tokenizer.json").read_text())
    added = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert len(tok["model"]["vocab"]) + len(added) == 4096
    assert set(SPECIALS) <= set(added) and min(added.values()) == 4096 - len(added)
    assert 0 not in added.values(), "id 0 is what the constant variant emits: it must not end a turn"
    assert tok["pre_tokenizer"]["type"] == "ByteLevel"

    template = (tiny_model / "chat_template.jinja").read_text()
    assert "<|start_header_id|>" in template and "<|eot_id|>" in template and "add_generation_prompt" in template
    assert json.loads((tiny_model / "tokenizer_config.json").read_text())["chat_template"] == template
    gen = json.loads((tiny_model / "generation_config.json").read_text())
    assert added["<|eot_id|>"] in gen["eos_token_id"] and gen["bos_token_id"] == added["<|begin_of_text|>"]
    assert is_current(tiny_model)


@pytest.mark.engine
def test_current_model_is_not_rebuilt(tiny_model):
    before = (tiny_model / "model.safetensors").stat()
    t0 = time.monotonic()
    assert ensure_tiny_model(tiny_model) == tiny_model
    assert time.monotonic() - t0 < 2.0
    after = (tiny_model / "model.safetensors").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.engine
def test_incomplete_dir_is_rebuilt_byte_identical(tiny_model, tmp_path):
    copy = tmp_path / "tiny"
    shutil.copytree(tiny_model, copy)
    (copy / "model.safetensors").unlink()  # what an interrupted copy or a manual delete leaves
    assert not is_current(copy)
    t0 = time.monotonic()
    assert ensure_tiny_model(copy) == copy
    print(f"tiny model build: {time.monotonic() - t0:.1f} s")
    for name in (*REQUIRED_FILES, STAMP):
        assert sha256(copy / name) == sha256(tiny_model / name), f"{name} differs between two builds"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tiny.build-")] == []


@pytest.mark.engine
def test_constant_variant_differs_only_in_the_final_norm(tiny_model, tiny_constant_model):
    assert sha256(tiny_constant_model / "tokenizer.json") == sha256(tiny_model / "tokenizer.json")
    plain, const = tensor_bytes(tiny_model / "model.safetensors"), tensor_bytes(tiny_constant_model / "model.safetensors")
    assert plain.keys() == const.keys()
    assert [k for k in plain if plain[k] != const[k]] == ["model.norm.weight"]
    assert const["model.norm.weight"] == bytes(len(const["model.norm.weight"]))  # float32 zeros
    assert json.loads((tiny_constant_model / STAMP).read_text())["spec"]["constant"] is True


def test_failed_build_leaves_no_partial_model(tmp_path):
    # The pack's own interpreter has no torch: the builder fails at its first import.
    with pytest.raises(CommandFailed, match="No module named 'torch'"):
        make_tiny_model(tmp_path / "m", EngineEnv(python=Path(sys.executable)), TinyModelSpec())
    assert list(tmp_path.iterdir()) == []


def test_cli_rejects_a_bad_interpreter(tmp_path):
    result = CliRunner().invoke(app, ["make-tiny-model", str(tmp_path / "m"), "--engine-python", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "not executable" in result.output
    assert not (tmp_path / "m").exists()


@pytest.mark.engine
def test_cli_leaves_an_up_to_date_model_alone(tiny_model, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    result = CliRunner().invoke(app, ["make-tiny-model", str(copy)])
    assert result.exit_code == 0 and "up to date" in result.output
    assert sha256(copy / "model.safetensors") == sha256(tiny_model / "model.safetensors")
