"""Prompt-set reading: accepted formats, stable ids, and malformed rows reported by line."""

from __future__ import annotations

import json

import pytest

from eagle3.errors import ConfigError
from eagle3.prompts import load_prompts


def write(tmp_path, lines: list[str | dict]):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join((json.dumps(x) if isinstance(x, dict) else x) + "\n" for x in lines))
    return path


def test_formats_normalised_and_trailing_answer_dropped(tmp_path):
    path = write(tmp_path, [
        {"id": "a", "conversations": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": "old answer"}]},
        {"id": 7, "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"},
                                    {"from": "human", "value": "q2"}]},
        "",
        {"messages": [{"role": "user", "content": "via messages"}]},
        {"prompt": "plain prompt"},
    ])
    ps = load_prompts(path)
    assert [p.line for p in ps.prompts] == [1, 2, 4, 5]
    a, b, c, d = ps.prompts
    assert a.id == "a" and [m["role"] for m in a.messages] == ["system", "user"]
    assert b.id == "7" and [m["content"] for m in b.messages] == ["q1", "a1", "q2"]
    assert [m["role"] for m in b.messages] == ["user", "assistant", "user"]
    assert c.id.startswith("sha-") and d.messages == ({"role": "user", "content": "plain prompt"},)
    assert ps.rows == 4 and len(ps.sha256) == 64


def test_derived_ids_are_stable_across_reads(tmp_path):
    path = write(tmp_path, [{"prompt": "one"}, {"prompt": "two"}])
    assert load_prompts(path).ids == load_prompts(path).ids
    assert len(set(load_prompts(path).ids)) == 2


def test_max_samples_keeps_the_first_valid_rows(tmp_path):
    path = write(tmp_path, [{"id": f"p{i}", "prompt": f"q{i}"} for i in range(10)])
    assert load_prompts(path, max_samples=3).ids == ["p0", "p1", "p2"]


def test_malformed_rows_reported_with_line_numbers(tmp_path):
    path = write(tmp_path, [
        {"id": "ok", "prompt": "fine"},
        "{not json",
        {"id": "x", "conversations": [{"role": "assistant", "content": "no user"}]},
        {"id": "y", "conversations": [{"role": "wizard", "content": "?"}]},
        {"id": "ok", "prompt": "duplicate id"},
        {"id": "z", "conversations": [{"role": "user", "content": [{"type": "image"}]}]},
        "[1, 2]",
        {"id": "w"},
    ])
    with pytest.raises(ConfigError) as err:
        load_prompts(path)
    msg = str(err.value)
    assert "7 malformed prompt row(s)" in msg
    for line, words in [(2, "not valid JSON"), (3, "no user turn"), (4, "'wizard'"), (5, "already used on line 1"),
                        (6, "content must be a string"), (7, "must be a JSON object"), (8, "no turns")]:
        assert f"{path}:{line}: " in msg and words in msg, (line, words, msg)
    assert f"{path}:1:" not in msg


def test_skip_invalid_keeps_good_rows_and_lists_the_rest(tmp_path):
    path = write(tmp_path, [{"id": "a", "prompt": "x"}, "oops", {"id": "b", "prompt": "y"}])
    ps = load_prompts(path, skip_invalid=True)
    assert ps.ids == ["a", "b"]
    assert len(ps.problems) == 1 and ps.problems[0].startswith(f"{path}:2:")


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="prompt file not found"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="no usable prompt rows"):
        load_prompts(write(tmp_path, [""]))
