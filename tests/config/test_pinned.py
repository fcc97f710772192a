"""A run's pinned config (eagle3.config.pinned): the same model and fingerprints as the YAML it copies,
wherever it is read from; a retry gets its own copy back whatever the YAML says now; a new run names
what changed, never a secret's value."""

from __future__ import annotations

import stat

import pytest
import yaml

from eagle3 import phase_table, safe_yaml
from eagle3.config import PipelineConfig, load_config
from eagle3.config.pinned import is_pinned, pin
from eagle3.errors import ConfigError
from tests.conftest import write_tiny_config


def edit(path, **sections) -> None:
    raw = yaml.safe_load(path.read_text())
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path.write_text(safe_yaml.dump(raw))


def test_the_pinned_copy_is_the_same_config_read_from_anywhere(tmp_path, monkeypatch):
    cfg = write_tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    pinned = pin(path, "run-1")
    assert pinned.path == cfg.run_dir / "state" / "configs" / "run-1.yaml" and is_pinned(pinned.path)
    assert stat.S_IMODE(pinned.path.stat().st_mode) == 0o600
    monkeypatch.chdir("/")  # its paths are absolute: the working directory does not matter
    again = load_config(pinned.path)
    assert again.model_dump(mode="json") == cfg.model_dump(mode="json")
    assert [again.fingerprint(p) for p in phase_table.names()] == [cfg.fingerprint(p) for p in phase_table.names()]
    assert pin(pinned.path, "run-2").path == pinned.path, "a pinned copy is handed on as it is"
    assert sorted(p.name for p in pinned.path.parent.iterdir()) == ["run-1.yaml"]


def test_a_retry_gets_what_its_run_started_with(tmp_path):
    write_tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    first = pin(path, "run-1")
    edit(path, train={"epochs": 9})
    retry = pin(path, "run-1")
    assert retry.path == first.path and retry.cfg.train.epochs == first.cfg.train.epochs != 9
    assert retry.changes == []
    later = pin(path, "run-2")
    assert later.cfg.train.epochs == 9 and later.path != first.path


def test_a_new_run_names_the_changed_fingerprints_and_keys_but_no_secret(tmp_path):
    cfg = write_tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    pin(path, "run-1")
    edit(path, train={"epochs": 4}, bench={"server": {**yaml.safe_load(path.read_text())["bench"]["server"],
                                                      "api_key": "s3cret-value"}})
    changes = pin(path, "run-2").changes
    assert [c.split(":", 1)[0] for c in changes] == ["train", "bench"]
    assert f"train: config fingerprint {cfg.fingerprint('train')} -> " in changes[0]
    assert "train.epochs: 1 -> 4" in changes[0]
    assert "bench.server.api_key: changed" in changes[1] and "s3cret" not in " ".join(changes)
    assert pin(path, "run-3").changes == [], "nothing changed since run-2"


def test_strings_the_loader_reads_as_numbers_come_back_as_strings(tmp_path, monkeypatch):
    # The pack's loader reads `0111906805729804` as a float, as YAML 1.1 does; PyYAML's own dumper wrote it
    # plain. A fingerprint is 16 hex digits, all of them decimal about once in 1,800: on 2026-12-07 CI's run
    # saw such a fingerprint come back as 111906805729804.0, and the next run named every phase changed.
    write_tiny_config(tmp_path)
    path = tmp_path / "config.yaml"
    edit(path, target={"served_name": "0123456789"})
    monkeypatch.setattr(PipelineConfig, "fingerprint", lambda self, section=None: "0111906805729804")
    first = pin(path, "run-1")
    assert load_config(first.path).target.served_name == "0123456789"
    assert pin(path, "run-2").changes == [], "the same config, the same fingerprints"


def test_a_broken_pinned_copy_is_refused_naming_it(tmp_path):
    write_tiny_config(tmp_path)
    pinned = pin(tmp_path / "config.yaml", "run-1").path
    raw = yaml.safe_load(pinned.read_text())
    raw["config"]["train"]["epochs"] = "many"
    pinned.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"run-1\.yaml \(pinned from .*config\.yaml\): train\.epochs"):
        load_config(pinned)


def test_a_pinned_copy_that_is_a_link_is_refused(tmp_path):
    from eagle3.owned import NotOwned

    write_tiny_config(tmp_path)
    first = pin(tmp_path / "config.yaml", "run-1").path
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text(first.read_text())
    first.unlink()
    first.symlink_to(elsewhere)
    with pytest.raises(NotOwned, match="pinned config"):
        pin(tmp_path / "config.yaml", "run-1")
