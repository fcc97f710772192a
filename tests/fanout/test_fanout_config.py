"""The optional `fanout` section: validated field by field with the fix named, never part of a
fingerprint (a finished phase is not redone because it ran sharded), and absent means today's run."""

from __future__ import annotations

import pytest

from eagle3.config.fanout import fanned_phases
from eagle3.errors import ConfigError

FANOUT = {"pools": ["node-a", "node-b"], "shards": {"datagen": 2, "extract": 3}}


def test_without_the_section_nothing_fans_out(make_config):
    cfg = make_config(check_files=False)
    assert cfg.fanout is None and fanned_phases(cfg, ["datagen", "extract", "train", "bench"]) == []


def test_the_section_names_pools_and_shard_counts(make_config):
    cfg = make_config({"fanout": FANOUT}, check_files=False)
    assert cfg.fanout.pools == ["node-a", "node-b"]
    assert fanned_phases(cfg, ["datagen", "extract", "train", "bench"]) == ["datagen", "extract"]
    assert cfg.fanout.count("train") == 1


def test_fanout_is_in_no_fingerprint(make_config, tmp_path):
    plain = make_config(check_files=False)
    sharded = make_config({"fanout": FANOUT}, check_files=False)
    for phase in (None, "datagen", "extract", "train", "bench"):
        assert plain.fingerprint(phase) == sharded.fingerprint(phase), phase


@pytest.mark.parametrize("fanout,field,fix", [
    ({"pools": ["a"], "shards": {"datagen": 0}}, "fanout.shards.datagen", "greater than or equal to 1"),
    ({"pools": ["a"], "shards": {"train": 2}}, "fanout.shards.train", "shardable phases: datagen, extract"),
    ({"pools": [], "shards": {"datagen": 2}}, "fanout.pools", "at least 1 item"),
    ({"pools": ["a", "a"]}, "fanout.pools", "must be distinct"),
    ({"pools": ["a b"]}, "fanout.pools[0]", "should match pattern"),
    ({"pools": ["a"], "shards": {"datagen": "2"}}, "fanout.shards.datagen", "valid integer"),
    ({"pools": ["a"], "retries": -1}, "fanout.retries", "greater than or equal to 0"),
    ({"pools": ["a"], "nodes": 2}, "fanout.nodes", "unknown key; remove it"),
])
def test_a_bad_section_names_the_field_and_the_fix(make_config, fanout, field, fix):
    with pytest.raises(ConfigError) as e:
        make_config({"fanout": fanout}, check_files=False)
    assert field in str(e.value) and fix in str(e.value), str(e.value)


def test_sharded_extraction_needs_files(make_config):
    with pytest.raises(ConfigError, match="fanout.shards.extract: sharded extraction writes hidden-state files"):
        make_config({"fanout": {"pools": ["a"], "shards": {"extract": 2}}, "hidden_states": {"mode": "online"}},
                    check_files=False)


def test_validate_says_what_the_accepted_section_will_do(make_config, tmp_path):
    from typer.testing import CliRunner

    from eagle3.cli import app

    make_config({"fanout": FANOUT, "hidden_states": {"mode": "offline"}}, check_files=False)
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "config.yaml")])
    assert result.exit_code == 0, result.output
    assert ("fanout: datagen in 2 shards, extract in 3 shards over pools node-a, node-b (shard i starts on pool i "
            "mod 2); 2 retries per shard; a shard silent for 180 s is lost; one not started after 60 s on a pool with no "
            "online worker moves") in " ".join(result.output.split())
