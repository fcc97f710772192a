"""The drafter that ships with the pack (configs/drafters/smollm2-135m-h200: trained by the pack on an H200
for SmolLM2-135M-Instruct): installed only from its pinned bytes, and refused before any server starts when
it was swapped, truncated or is served with another target than it was trained for."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from eagle3.phases.bench_inputs import drafter_gate, parity_expectation, resolve_drafter, training_prompts
from eagle3.cli import app
from eagle3.drafters import shipped
from eagle3.drafters.formats import PROVENANCE
from eagle3.errors import ConfigError, GateError
from eagle3.prompts.generate import generate

from tests.conftest import REPO, REAL_MODEL, write_tiny_config

runner = CliRunner()
ROW = shipped.SMOLLM2_H200


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def files_of(d: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(d.iterdir()) if p.is_file()}


def test_the_committed_files_are_the_pinned_ones_and_small_enough_for_every_clone():
    for name, digest in ROW.files_sha256.items():
        assert sha256(ROW.source / name) == digest, name
    assert (ROW.source / shipped.ARCHIVE).stat().st_size < 21_000_000  # the weights, xz, less the target's embeddings
    provenance = json.loads((ROW.source / PROVENANCE).read_text())
    assert provenance["trained"] is True and provenance["training"]["val_full_acc"] == [0.785, 0.624, 0.506]
    assert provenance["made"]["pack_commit"] and Path(REPO / provenance["made"]["raw_files"]).is_dir()
    # Its training prompts: the first 4,096 of the 16k set its data came from (sha256 in its provenance) are
    # the committed file the row names.
    sixteen_k = generate(16384, 512, 0).train
    text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in sixteen_k)
    assert hashlib.sha256(text.encode()).hexdigest() == provenance["data"]["prompts_sha256"]
    committed = (REPO / ROW.training_prompts).read_text().splitlines()
    assert len(committed) == provenance["data"]["samples"] == 4096
    assert committed == text.splitlines()[:4096]


def test_install_writes_the_bytes_the_gpu_wrote_once_and_refuses_a_changed_source(tmp_path):
    out = tmp_path / "drafter"
    r = runner.invoke(app, ["install-drafter", ROW.name, str(out)])
    assert r.exit_code == 0 and "installed" in r.output, r.output
    assert sha256(out / "model.safetensors") == ROW.weights_sha256
    assert (out / "model.safetensors").stat().st_size == ROW.weights_bytes
    assert shipped.installed_problem(out) is None and shipped.row_of(out) == ROW
    before = files_of(out)
    r = runner.invoke(app, ["install-drafter", ROW.name, str(out)])
    assert r.exit_code == 0 and "up to date" in r.output and files_of(out) == before
    # A committed source that was changed (one byte) or truncated is refused, and the installed dir stays.
    for what, mutate in (("changed", lambda b: b[:1000] + bytes([b[1000] ^ 1]) + b[1001:]), ("truncated", lambda b: b[:-4096])):
        src = tmp_path / f"src-{what}"
        shutil.copytree(ROW.source, src)
        (src / shipped.ARCHIVE).write_bytes(mutate((src / shipped.ARCHIVE).read_bytes()))
        with pytest.raises(ConfigError, match="changed or truncated"):
            shipped.install(dataclasses.replace(ROW, source_dir=str(src)), out)
        assert files_of(out) == before
    assert not [p for p in tmp_path.iterdir() if ".install-" in p.name]


def test_an_unknown_name_is_refused_naming_what_ships(tmp_path):
    r = runner.invoke(app, ["install-drafter", "llama-70b-h100", str(tmp_path / "d")])
    assert r.exit_code == 2 and "smollm2-135m-h200" in r.output and not (tmp_path / "d").exists()


@pytest.fixture
def installed(tmp_path) -> Path:
    return shipped.install(ROW, tmp_path / "installed")


def _config(tmp_path: Path, drafter: Path, target: Path, **bench):
    return write_tiny_config(tmp_path / "cfg", {"target": {"model": str(target)},
                                                "bench": {"drafter": str(drafter), **bench}}, check_files=False)


@pytest.mark.engine
def test_a_swapped_or_truncated_install_is_refused_before_any_server(installed, smollm2_model, tmp_path):
    cfg = _config(tmp_path, installed, smollm2_model)
    report, _ = drafter_gate(cfg, resolve_drafter(cfg))
    assert report.ok, report.render()
    weights = installed / "model.safetensors"
    good = weights.read_bytes()
    for bad in (good[:-4096], good[:5000] + bytes([good[5000] ^ 0xFF]) + good[5001:]):
        weights.write_bytes(bad)
        report, _ = drafter_gate(cfg, resolve_drafter(cfg))
        why = [p.message for p in report.problems if p.where == "shipped drafter"]
        assert why and "not the installed smollm2-135m-h200" in why[0] and "--force" in why[0]
    weights.write_bytes(good)
    assert shipped.installed_problem(installed) is None


@pytest.mark.engine
def test_served_with_another_target_it_is_refused_and_the_benchmark_starts_nothing(installed, tiny_model, tmp_path):
    cfg = _config(tmp_path, installed, tiny_model)
    report, _ = drafter_gate(cfg, resolve_drafter(cfg))
    why = " ".join(p.message for p in report.problems if p.where == "shipped drafter")
    assert "trained for SmolLM2-135M-Instruct" in why and "not a model `eagle3 make-model` made" in why
    r = runner.invoke(app, ["bench", str(tmp_path / "cfg" / "config.yaml")])
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "not loadable as trained" in text and "no server was started" in text
    assert not list(cfg.run_dir.glob("bench/**/*.log"))  # no server, no load generator


@pytest.mark.engine
def test_its_own_training_record_is_the_parity_expectation_on_its_own_training_prompts(installed, smollm2_model,
                                                                                        tmp_path):
    cfg = _config(tmp_path, installed, smollm2_model)
    drafter = resolve_drafter(cfg)
    assert drafter["trained"] and drafter["shipped"] == ROW.name and "shipped with the pack" in drafter["status"]
    expected, source = parity_expectation(cfg, drafter)
    assert expected == [0.785, 0.624, 0.506] and "the drafter's own training record" in source
    rows = training_prompts(cfg, drafter)
    trained_on = {json.loads(line)["id"] for line in (REPO / ROW.training_prompts).read_text().splitlines()}
    assert len(rows) == cfg.bench.parity.prompts and {p.id for p in rows} <= trained_on
    # A drafter that is not shipped, given without its training prompts, gets no expectation from its record.
    other = tmp_path / "other"
    shutil.copytree(installed, other)
    (other / shipped.STAMP).unlink()
    cfg = _config(tmp_path, other, REAL_MODEL, drafter_trained=True)
    assert parity_expectation(cfg, resolve_drafter(cfg)) == (None, None)
