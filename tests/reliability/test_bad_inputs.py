"""Corrupt or partial inputs that the rest of the suite does not already cover: a damaged target
config.json, an empty prompt set, a damaged extraction manifest. Each is a clear error naming the
file (and line/column or key), raised before anything is launched. (Malformed prompt rows, bad
checkpoints and the 55 invalid configs are proven elsewhere; see the README's Reliability table.)"""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from eagle3.cli import app
from eagle3.errors import ConfigError
from eagle3.phases.datagen import DatagenPaths, run_datagen
from eagle3.phases.extract_manifest import ManifestError, manifest_path, read_extract_manifest

runner = CliRunner()


@pytest.mark.parametrize("text,says", [
    ('{"num_hidden_layers": 8,', "is not valid JSON (line 1, column 25"),
    ("[8, 128]", "must hold a JSON object"),
    ('{"num_hidden_layers": "eight"}', "num_hidden_layers is 'eight', not an integer"),
], ids=["truncated", "not-an-object", "layers-not-an-int"])
def test_damaged_target_config_json_exits_2_naming_the_file(make_config, tmp_path, text, says):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(text)
    make_config({"target": {"model": str(model)}, "engines": {"vllm": {"python": sys.executable},
                                                               "speculators": {"python": sys.executable}}},
                check_files=False)
    result = runner.invoke(app, ["validate", str(tmp_path / "config.yaml")])
    assert result.exit_code == 2, result.output
    assert f"target.model: {model / 'config.json'}" in result.output and says in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("text,skip_invalid", [("", False), ("\n  \n", False), ('not json\n{"id": "x"}\n', True)],
                         ids=["empty-file", "blank-lines", "no-valid-row-when-skipping"])
def test_empty_prompt_set_is_refused_naming_the_file_before_any_server(make_config, tmp_path, text, skip_invalid):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(text)
    cfg = make_config({"datagen": {"prompts": str(prompts), "skip_invalid_prompts": skip_invalid}}, check_files=False)
    with pytest.raises(ConfigError) as err:
        run_datagen(cfg, sup=None)  # without a supervisor: reaching the server start would fail otherwise
    assert str(err.value).startswith(f"{prompts}: no usable prompt rows"), err.value
    assert not err.value.retryable
    paths = DatagenPaths.of(cfg)
    assert not paths.samples.exists() and not paths.manifest.exists() and not paths.summary.exists()


@pytest.mark.parametrize("text,says", [('{"layer_ids": [2, 4', "unreadable extraction manifest"),
                                       ("[]", "malformed manifest (a JSON list")],
                         ids=["truncated", "not-an-object"])
def test_damaged_extract_manifest_names_the_file(make_config, text, says):
    cfg = make_config(check_files=False)
    path = manifest_path(cfg)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(ManifestError) as err:
        read_extract_manifest(cfg, check_config=False)  # what train and bench read first
    assert str(err.value).startswith(f"{path}: {says}"), err.value
    assert "extract" in str(err.value)
