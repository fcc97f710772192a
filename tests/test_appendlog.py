"""Append-only JSONL: torn tails are cut, damage in the middle is refused, rows are whole."""

from __future__ import annotations

import json

import pytest

from eagle3.appendlog import AppendLog, recover
from eagle3.errors import ConfigError


def test_append_then_recover_roundtrip(tmp_path):
    path = tmp_path / "d" / "rows.jsonl"
    with AppendLog(path, fsync_every=3) as log:
        for i in range(7):
            log.append({"id": str(i), "text": "é" * i})
    assert [r["id"] for r in recover(path)] == [str(i) for i in range(7)]
    assert path.read_bytes().endswith(b"\n")


def test_torn_tail_is_cut_and_appending_continues_cleanly(tmp_path):
    path = tmp_path / "rows.jsonl"
    good = "".join(json.dumps({"id": str(i)}) + "\n" for i in range(3))
    path.write_text(good + '{"id": "3", "conv')  # a crash mid-write
    assert [r["id"] for r in recover(path)] == ["0", "1", "2"]
    assert path.read_text() == good
    with AppendLog(path) as log:
        log.append({"id": "3"})
    assert [r["id"] for r in recover(path)] == ["0", "1", "2", "3"]


def test_unparseable_complete_last_lines_are_cut(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"id": "0"}\n\x00\x00\x00\n{"id": \n')  # zeros: what a power cut can leave
    assert [r["id"] for r in recover(path)] == ["0"]
    assert path.read_bytes() == b'{"id": "0"}\n'


def test_damage_in_the_middle_is_refused_with_line_number(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "0"}\nGARBAGE\n{"id": "2"}\n')
    with pytest.raises(ConfigError, match=r"rows.jsonl:2: .*repair or delete line 2"):
        recover(path)
    assert path.read_text() == '{"id": "0"}\nGARBAGE\n{"id": "2"}\n'  # untouched


def test_missing_file_is_empty(tmp_path):
    assert recover(tmp_path / "none.jsonl") == []
