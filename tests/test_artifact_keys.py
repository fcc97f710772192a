"""Artifact keys: one function, checked against Prefect's own validation of a key (the schema the
client sends an artifact with), for config names the config accepts and labels the pack builds."""

from __future__ import annotations

import pytest
from prefect.client.schemas.actions import ArtifactCreate

from tasks.artifact_keys import artifact_key


def prefect_accepts(key: str) -> bool:
    try:
        ArtifactCreate(key=key, data="x")
    except ValueError:
        return False
    return True


def test_prefect_refuses_a_config_name_with_a_dot_as_it_is():
    assert not prefect_accepts("llama-3.1-preflight"), "the check below would prove nothing"


@pytest.mark.parametrize("name,parts,expected", [
    ("llama-3.1", ("preflight",), "llama-3-1-preflight"),
    ("Tiny_CPU", ("bench", "table"), "tiny-cpu-bench-table"),
    ("Qwen2.5-7B", ("handoff", "start-to-datagen"), "qwen2-5-7b-handoff-start-to-datagen"),
    ("r..un__", ("train",), "r-un-train"),
    ("café-ünïcode", ("pipeline",), "caf-n-code-pipeline"),
    ("..", (), "eagle3"),
])
def test_every_key_is_one_prefect_accepts(name, parts, expected):
    key = artifact_key(name, *parts)
    assert key == expected
    assert prefect_accepts(key)


def test_the_pack_builds_keys_in_one_place_only():
    """No other module builds a key: every `key=` of an artifact call goes through artifact_key."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    calls = re.compile(r"create_\w+_artifact\((?:[^()]|\([^()]*\))*?key=(?!artifact_key\()", re.S)
    offenders = [str(p.relative_to(repo)) for d in ("eagle3", "tasks", "flows") for p in (repo / d).rglob("*.py")
                 if calls.search(p.read_text())]
    assert not offenders, f"artifact keys built outside tasks/artifact_keys.py: {offenders}"
