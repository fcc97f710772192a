"""Checkpoint gate and export: each way a drafter goes wrong is caught with a message that says what
to fix, and the export makes an SGLang-bound speculators checkpoint loadable (re-gate passes).

The checkpoints are real safetensors files in the trainer's exact layout (names and shapes of a
`speculators train` checkpoint for the tiny target: hidden 128, 4 heads / 2 KV heads, FFN 256,
vocab 4096, draft vocab 2048, aux layers [2, 4, 5]), written in pure Python with zeroed tensors.
"""

from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3.drafters.loadable import check_drafter
from eagle3.cli import app
from eagle3.drafters.export import export_drafter
from eagle3.safetensors_header import DTYPE_BYTES, read_header, read_tensor_bytes

H, I, V, DV, HEADS, KV, HD = 128, 256, 4096, 2048, 4, 2, 32
AUX = [2, 4, 5]
FIXTURE_TARGET = Path(__file__).parent / "fixtures" / "eagle3-tiny" / "target"


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    """Tensor i is filled with the byte (i % 251) + 1, so a copy that moves bytes is detectable."""
    header, offset, blobs = {}, 0, []
    for i, (name, (dtype, shape)) in enumerate(tensors.items()):
        n = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        blobs.append(bytes([(i % 251) + 1]) * n)
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def speculators_tensors(norm_before_fc: bool = True) -> dict[str, tuple[str, tuple[int, ...]]]:
    t = {
        "d2t": ("I64", (DV,)), "t2d": ("BOOL", (V,)),
        "embed_tokens.weight": ("BF16", (V, H)), "fc.weight": ("BF16", (H, 3 * H)),
        "layers.0.hidden_norm.weight": ("BF16", (H,)), "layers.0.input_layernorm.weight": ("BF16", (H,)),
        "layers.0.post_attention_layernorm.weight": ("BF16", (H,)),
        "layers.0.mlp.down_proj.weight": ("BF16", (H, I)), "layers.0.mlp.gate_proj.weight": ("BF16", (I, H)),
        "layers.0.mlp.up_proj.weight": ("BF16", (I, H)),
        "layers.0.self_attn.q_proj.weight": ("BF16", (HEADS * HD, 2 * H)),
        "layers.0.self_attn.k_proj.weight": ("BF16", (KV * HD, 2 * H)),
        "layers.0.self_attn.v_proj.weight": ("BF16", (KV * HD, 2 * H)),
        "layers.0.self_attn.o_proj.weight": ("BF16", (H, HEADS * HD)),
        "lm_head.weight": ("BF16", (DV, H)), "norm.weight": ("BF16", (H,)),
    }
    if norm_before_fc:
        t["input_norm.weight"] = ("BF16", (3 * H,))
    return t


def speculators_config(norm_flags: bool = True, aux=AUX) -> dict:
    """The config.json `speculators train` writes (fields as in a real 0.9.0 checkpoint)."""
    return {
        "architectures": ["Eagle3DraftModel"], "auto_map": {"": "config.Eagle3SpeculatorConfig"},
        "draft_vocab_size": DV, "dtype": "bfloat16", "eagle_aux_hidden_state_layer_ids": list(aux),
        "embed_requires_grad": False, "fc_norm": False, "norm_before_fc": norm_flags,
        "norm_before_residual": norm_flags, "norm_output": norm_flags,
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3,
                                                     "accept_tolerance": 0.0, "verifier_accept_k": 1}],
                               "verifier": {"architectures": ["LlamaForCausalLM"], "name_or_path": "target"}},
        "speculators_model_type": "eagle3", "speculators_version": "0.9.0", "target_hidden_size": None,
        "tie_word_embeddings": False,
        "transformer_layer_config": {
            "model_type": "llama", "hidden_size": H, "intermediate_size": I, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": HD, "num_hidden_layers": 1, "vocab_size": V,
            "rms_norm_eps": 1e-5, "hidden_act": "silu", "max_position_embeddings": 2048,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "attention_bias": False,
            "layer_types": ["sliding_attention"], "sliding_window": 2048, "use_sliding_window": True},
    }


def make_ckpt(directory: Path, config: dict | None = None, tensors: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config or speculators_config()))
    write_safetensors(directory / "model.safetensors", tensors if tensors is not None else speculators_tensors())
    return directory


def problems_at(report, where: str) -> list[str]:
    return [p.message for p in report.problems if p.where == where]


# ---- a good checkpoint passes ------------------------------------------------------------------

def test_trainer_layout_passes_vllm_gate(tmp_path):
    report = check_drafter(make_ckpt(tmp_path / "ok"), "vllm", target=FIXTURE_TARGET, expected_aux_ids=AUX)
    assert report.ok, report.render()
    assert report.aux_layer_ids == AUX and report.aux_layer_ids_vllm == AUX and report.draft_vocab_size == DV


# ---- each failure mode ----------------------------------------------------------------------------

def test_renamed_keys_are_caught(tmp_path):
    """Keys with an extra `model.` prefix (an HF-style save): vLLM's loader would fail on them."""
    tensors = {("model." + k if k.startswith(("layers.", "fc.")) else k): v for k, v in speculators_tensors().items()}
    report = check_drafter(make_ckpt(tmp_path / "renamed", tensors=tensors), "vllm", expected_aux_ids=AUX)
    assert not report.ok
    assert "missing" in problems_at(report, "fc.weight")[0]
    assert "layers.0.self_attn.q_proj.weight" in {p.where for p in report.problems}
    unknown = problems_at(report, "model.fc.weight")
    assert unknown and "fails the whole load" in unknown[0] and "rename it" in unknown[0]


def test_missing_fc_is_caught(tmp_path):
    tensors = speculators_tensors()
    del tensors["fc.weight"]
    report = check_drafter(make_ckpt(tmp_path / "nofc", tensors=tensors), "vllm", expected_aux_ids=AUX)
    (msg,) = problems_at(report, "fc.weight")
    assert "missing (expected shape [128, 384])" in msg and "cannot fuse the aux hidden states" in msg


def test_wrong_shapes_are_caught(tmp_path):
    tensors = speculators_tensors()
    tensors["fc.weight"] = ("BF16", (H, 4 * H))            # trained on 4 aux layers
    tensors["lm_head.weight"] = ("BF16", (1024, H))        # head for another draft vocab
    report = check_drafter(make_ckpt(tmp_path / "shapes", tensors=tensors), "vllm", expected_aux_ids=AUX)
    (fc,) = problems_at(report, "fc.weight")
    assert "shape [128, 512], expected [128, 384]" in fc and "number of aux layers" in fc
    (head,) = problems_at(report, "lm_head.weight")
    assert "shape [1024, 128], expected [2048, 128]" in head and "draft_vocab_size" in head


def test_mismatched_layer_ids_are_caught(tmp_path):
    ckpt = make_ckpt(tmp_path / "ids", config=speculators_config(aux=[1, 4, 5]))
    report = check_drafter(ckpt, "vllm", expected_aux_ids=AUX)
    (msg,) = problems_at(report, "eagle_aux_hidden_state_layer_ids")
    assert "came from layers [2, 4, 5]" in msg and "set it to [2, 4, 5]" in msg


def test_missing_layer_ids_are_caught(tmp_path):
    config = speculators_config()
    del config["eagle_aux_hidden_state_layer_ids"]
    report = check_drafter(make_ckpt(tmp_path / "noids", config=config), "vllm", expected_aux_ids=AUX)
    (msg,) = problems_at(report, "eagle_aux_hidden_state_layer_ids")
    assert "missing" in msg and "default layers" in msg and "set it to [2, 4, 5]" in msg


def test_target_mismatch_is_caught(tmp_path):
    config = speculators_config(aux=[2, 4, 9])
    config["transformer_layer_config"]["vocab_size"] = 32000
    tensors = speculators_tensors()
    tensors["t2d"], tensors["embed_tokens.weight"] = ("BOOL", (32000,)), ("BF16", (32000, H))
    report = check_drafter(make_ckpt(tmp_path / "other", config, tensors), "vllm", target=FIXTURE_TARGET)
    assert "retrain against this one" in problems_at(report, "transformer_layer_config.vocab_size")[0]
    assert any("do not exist in a 8-layer target" in m for m in problems_at(report, "eagle_aux_hidden_state_layer_ids"))


def test_missing_d2t_with_reduced_vocab_is_caught(tmp_path):
    tensors = speculators_tensors()
    del tensors["d2t"]
    report = check_drafter(make_ckpt(tmp_path / "nod2t", tensors=tensors), "vllm")
    (msg,) = problems_at(report, "d2t")
    assert "draft vocab 2048 < target vocab 4096" in msg and "token-frequency" in msg


def test_speculators_checkpoint_for_sglang_is_caught_and_export_fixes_names(tmp_path):
    """F7: SGLang wants midlayer.*; it drops layers.0.* silently. The gate says so and names the
    export; after the export the gate passes (for a drafter trained with SGLang's norm options)."""
    src = make_ckpt(tmp_path / "spec", speculators_config(norm_flags=False), speculators_tensors(norm_before_fc=False))
    report = check_drafter(src, "sglang", target=FIXTURE_TARGET, expected_aux_ids=AUX)
    assert not report.ok
    (names,) = problems_at(report, "layers.0.*")
    assert "expects midlayer.*" in names and "drops them silently" in names and "export-drafter" in names
    assert any("LlamaForCausalLMEagle3" in m and "export" in m for m in problems_at(report, "architectures"))
    # ids are stored in the vllm convention; SGLang would add 1 to each
    (ids,) = problems_at(report, "eagle_aux_hidden_state_layer_ids")
    assert "means layers [3, 5, 6]" in ids and "set it to [1, 3, 4]" in ids

    out = export_drafter(src, tmp_path / "sglang", "sglang")
    again = check_drafter(out, "sglang", target=FIXTURE_TARGET, expected_aux_ids=AUX)
    assert again.ok, again.render()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["hidden_size"] == H and config["draft_vocab_size"] == DV
    # the tensor bytes were copied unchanged under the new names
    old, new = read_header(src / "model.safetensors"), read_header(out / "model.safetensors")
    assert set(new.tensors) == {k.replace("layers.0.", "midlayer.") for k in old.tensors}
    for name in ("layers.0.self_attn.q_proj.weight", "fc.weight", "d2t"):
        assert read_tensor_bytes(new, name.replace("layers.0.", "midlayer.")) == read_tensor_bytes(old, name)
    # and the export is not for vLLM: vLLM would read SGLang's ids as-is (the off-by-one trap)
    vllm = check_drafter(out, "vllm", expected_aux_ids=AUX)
    assert any("means layers [1, 3, 4]" in p.message for p in vllm.problems)


def test_sglang_gate_refuses_norm_options_it_cannot_serve(tmp_path):
    src = make_ckpt(tmp_path / "spec")  # speculators defaults: norm_before_fc etc. true, input_norm present
    report = check_drafter(export_drafter(src, tmp_path / "sg", "sglang"), "sglang", expected_aux_ids=AUX)
    assert {"norm_before_fc", "norm_before_residual", "norm_output", "input_norm.weight"} <= {p.where for p in report.problems}
    assert all("--no-norm-before-fc" in m for m in problems_at(report, "input_norm.weight"))


def test_export_to_vllm_renames_midlayer_and_converts_ids(tmp_path):
    src = make_ckpt(tmp_path / "spec", speculators_config(norm_flags=False), speculators_tensors(norm_before_fc=False))
    sg = export_drafter(src, tmp_path / "sg", "sglang")
    back = export_drafter(sg, tmp_path / "vllm", "vllm")  # EAGLE layout, ids read as SGLang's
    report = check_drafter(back, "vllm", target=FIXTURE_TARGET, expected_aux_ids=AUX)
    assert report.ok, report.render()
    assert set(read_header(back / "model.safetensors").tensors) == set(speculators_tensors(norm_before_fc=False))


# ---- CLI ----------------------------------------------------------------------------------------

def test_check_drafter_cli_exit_codes(tmp_path):
    good = make_ckpt(tmp_path / "good")
    runner = CliRunner()
    ok = runner.invoke(app, ["check-drafter", str(good), "--engine", "vllm", "--target", str(FIXTURE_TARGET),
                             "--aux-layer-ids", "2", "--aux-layer-ids", "4", "--aux-layer-ids", "5"])
    assert ok.exit_code == 0, ok.output
    assert "PASS for vllm" in ok.output
    bad = runner.invoke(app, ["check-drafter", str(good), "--engine", "sglang"])
    assert bad.exit_code == 1
    assert "layers.0.*" in bad.output and "export-drafter" in bad.output
    usage = runner.invoke(app, ["check-drafter", str(good), "--engine", "tgi"])
    assert usage.exit_code == 2


def test_truncated_weights_file_is_caught(tmp_path):
    ckpt = make_ckpt(tmp_path / "cut")
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    report = check_drafter(ckpt, "vllm")
    (msg,) = problems_at(report, "model.safetensors")
    assert "truncated" in msg and "re-save" in msg


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_missing_config_is_caught(tmp_path, engine):
    ckpt = make_ckpt(tmp_path / "x")
    (ckpt / "config.json").unlink()
    report = check_drafter(ckpt, engine)
    assert not report.ok and "not found" in problems_at(report, "config.json")[0]


def test_export_replaces_previous_export_atomically(tmp_path):
    src = make_ckpt(tmp_path / "spec", speculators_config(norm_flags=False), speculators_tensors(norm_before_fc=False))
    out = tmp_path / "sg"
    export_drafter(src, out, "sglang")
    (out / "stale.txt").write_text("old")
    export_drafter(src, out, "sglang")
    assert not (out / "stale.txt").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".sg.")]
    shutil.rmtree(out)


def test_vllm_accepts_midlayer_names(tmp_path):
    """vLLM maps midlayer.* to layers.0.*: an EAGLE-reference-format drafter passes the vLLM gate."""
    from eagle3.drafters.loadable import check_drafter
    from eagle3.drafters.export import export_drafter

    src = Path(__file__).resolve().parent / "fixtures" / "eagle3-tiny" / "drafter-trained"
    if not src.is_dir():
        pytest.skip("trained drafter fixture missing")
    sg = tmp_path / "sglang-layout"
    export_drafter(src, sg, "sglang")
    report = check_drafter(sg, "vllm")
    assert not [p for p in report.problems if p.where.startswith(("midlayer", "layers"))], report.render()
