"""`eagle3 validate`: the shipped configs pass; broken ones exit 2 naming the field and the fix."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from eagle3.cli import app
from eagle3.config import load_config

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture
def base(tmp_path) -> dict:
    """A valid config whose model dir and interpreters exist in tmp_path (no engine needed)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "conversations": [{"role": "user", "content": "hi"}]}\n')
    raw = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    raw["run_dir"] = str(tmp_path / "run")
    raw["target"]["model"] = str(model)
    raw["datagen"]["prompts"] = str(prompts)
    for env in raw["engines"].values():
        env["python"] = sys.executable
    return raw


def validate(tmp_path: Path, raw) -> tuple[int, str]:
    path = tmp_path / "cfg.yaml"
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    result = runner.invoke(app, ["validate", str(path)])
    return result.exit_code, result.output


def test_valid_base_passes(tmp_path, base):
    code, output = validate(tmp_path, base)
    assert code == 0, output
    assert "valid" in output


def test_shipped_tiny_config_is_valid_once_built(tiny_model):
    result = runner.invoke(app, ["validate", str(REPO / "configs" / "tiny-cpu.yaml")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("example", sorted((REPO / "configs" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_parse(example):
    """Examples for GPU nodes name paths that only exist there: check shape and cross-field rules."""
    cfg = load_config(example, check_files=False)
    assert cfg.gpus, "GPU examples must list their GPUs"


def _set(raw: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value


DELETE = object()

# (case id, {dotted path: new value}, text the message must contain to name the field)
BROKEN = [
    ("missing-model-dir", {"target.model": "/nonexistent/model"}, "target.model"),
    ("model-dir-without-config", {"target.model": "/tmp"}, "target.model"),
    ("missing-target", {"target": DELETE}, "target"),
    ("missing-name", {"name": DELETE}, "name"),
    ("bad-name", {"name": "has spaces"}, "name"),
    ("unknown-engine-datagen", {"datagen.engine": "tgi"}, "datagen.engine"),
    ("unknown-engine-bench", {"bench.engine": "trtllm"}, "bench.engine"),
    ("extract-engine-sglang", {"extract.engine": "sglang"}, "extract.engine"),
    ("port-zero", {"datagen.server.port": 0}, "datagen.server.port"),
    ("port-too-big", {"bench.server.port": 70000}, "bench.server.port"),
    ("port-string", {"extract.server.port": "eighty"}, "extract.server.port"),
    ("duplicate-ports", {"bench.server.port": 18601}, "bench.server.port"),
    ("gpu-ids-not-ints", {"gpus": ["a", "b"]}, "gpus"),
    ("gpu-ids-float", {"gpus": [0.5]}, "gpus"),
    ("gpu-ids-negative", {"gpus": [-1]}, "gpus"),
    ("gpu-ids-duplicate", {"gpus": [0, 0]}, "gpus"),
    ("gpus-not-list", {"gpus": 4}, "gpus"),
    ("negative-concurrency", {"datagen.concurrency": -4}, "datagen.concurrency"),
    ("zero-max-tokens", {"datagen.sampling.max_tokens": 0}, "datagen.sampling.max_tokens"),
    ("negative-temperature", {"datagen.sampling.temperature": -0.1}, "datagen.sampling.temperature"),
    ("top-p-above-one", {"datagen.sampling.top_p": 1.5}, "datagen.sampling.top_p"),
    ("negative-max-samples", {"datagen.max_samples": -1}, "datagen.max_samples"),
    ("negative-retries", {"datagen.max_retries": -2}, "datagen.max_retries"),
    ("unknown-top-level-key", {"datagne": {}}, "datagne"),
    ("unknown-nested-key", {"datagen.server.prot": 1234}, "datagen.server.prot"),
    ("unknown-handoff-key", {"handoff.sleep_s": 5}, "handoff.sleep_s"),
    ("wrong-type-extra-args", {"datagen.server.extra_args": "--enforce-eager"}, "datagen.server.extra_args"),
    ("wrong-type-epochs", {"train.epochs": "three"}, "train.epochs"),
    ("zero-epochs", {"train.epochs": 0}, "train.epochs"),
    ("negative-lr", {"train.lr": -1e-4}, "train.lr"),
    ("bad-dry-run", {"train.dry_run": "maybe"}, "train.dry_run"),
    ("spec-tokens-zero", {"bench.num_speculative_tokens": [0]}, "bench.num_speculative_tokens"),
    ("spec-tokens-empty", {"bench.num_speculative_tokens": []}, "bench.num_speculative_tokens"),
    ("bench-concurrency-dupes", {"bench.concurrency": [4, 4]}, "bench.concurrency"),
    ("acceptance-floor-below-one", {"bench.acceptance_floor": 0.5}, "bench.acceptance_floor"),
    ("aux-layer-out-of-range", {"extract.aux_layer_ids": [2, 4, 40]}, "extract.aux_layer_ids"),
    ("aux-layer-negative", {"extract.aux_layer_ids": [-1, 2, 3]}, "extract.aux_layer_ids"),
    ("aux-layer-duplicates", {"extract.aux_layer_ids": [2, 2, 5]}, "extract.aux_layer_ids"),
    ("handoff-negative-grace", {"handoff.grace_s": -1}, "handoff.grace_s"),
    ("handoff-zero-deadline", {"handoff.deadline_s": 0}, "handoff.deadline_s"),
    ("handoff-threshold-negative", {"handoff.used_mib_threshold": -5}, "handoff.used_mib_threshold"),
    ("systemd-unit-with-shell", {"handoff.systemd_units": ["vllm; rm -rf /"]}, "handoff.systemd_units"),
    ("engine-env-empty", {"engines.vllm": {}}, "engines.vllm"),
    ("engine-env-both", {"engines.vllm": {"python": sys.executable, "command_prefix": ["conda", "run"]}}, "engines.vllm"),
    ("engine-python-missing", {"engines.speculators.python": "/nonexistent/bin/python"}, "engines.speculators.python"),
    ("engine-for-sglang-missing", {"datagen.engine": "sglang"}, "engines.sglang"),
    ("speculators-missing", {"engines.speculators": DELETE}, "engines.speculators"),
    ("tp-above-gpu-count", {"gpus": [0, 1], "target.tensor_parallel_size": 4}, "target.tensor_parallel_size"),
    ("tp-on-cpu", {"target.tensor_parallel_size": 2}, "target.tensor_parallel_size"),
    ("bad-dtype", {"target.dtype": "int3"}, "target.dtype"),
    ("zero-max-model-len", {"target.max_model_len": 0}, "target.max_model_len"),
    ("served-name-with-space", {"target.served_name": "my model"}, "target.served_name"),
    ("prompts-missing", {"datagen.prompts": "/nonexistent/prompts.jsonl"}, "datagen.prompts"),
    ("startup-timeout-zero", {"datagen.server.startup_timeout_s": 0}, "datagen.server.startup_timeout_s"),
]


@pytest.mark.parametrize("case,changes,field", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_config_exits_2_naming_the_field(tmp_path, base, case, changes, field):
    raw = copy.deepcopy(base)
    for dotted, value in changes.items():
        _set(raw, dotted, value)
    code, output = validate(tmp_path, raw)
    assert code == 2, f"{case}: expected exit 2, got {code}\n{output}"
    assert field in output, f"{case}: message does not name {field!r}:\n{output}"
    assert "Traceback" not in output


def test_every_problem_is_listed_at_once(tmp_path, base):
    raw = copy.deepcopy(base)
    _set(raw, "datagen.server.port", 0)
    _set(raw, "train.epochs", 0)
    _set(raw, "bench.engine", "nope")
    code, output = validate(tmp_path, raw)
    assert code == 2
    for field in ("datagen.server.port", "train.epochs", "bench.engine"):
        assert field in output


@pytest.mark.parametrize("text,needle", [
    ("", "empty"),
    ("name: [unclosed", "not valid YAML"),
    ("- a\n- b\n", "mapping"),
], ids=["empty-file", "bad-yaml", "list-top-level"])
def test_unparseable_files_exit_2(tmp_path, text, needle):
    code, output = validate(tmp_path, text)
    assert code == 2 and needle in output, output


def test_missing_file_exit_2(tmp_path):
    result = runner.invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "not found" in result.output


def test_relative_paths_resolve_against_the_config_file(tmp_path, base):
    sub = tmp_path / "sub"
    sub.mkdir()
    raw = copy.deepcopy(base)
    raw["run_dir"] = "runs/x"
    path = sub / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.run_dir == (sub / "runs" / "x").resolve()


def test_shell_metacharacters_stay_literal_strings(tmp_path, base):
    raw = copy.deepcopy(base)
    raw["datagen"]["server"]["extra_args"] = ["--served-model-name", "$(touch /tmp/pwned); `id` | cat > x"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    assert cfg.datagen.server.extra_args[1] == "$(touch /tmp/pwned); `id` | cat > x"
