"""Benchmark prompt sets as users have them (eagle3/prompts/sets.py), from small synthetic files
written here: MT-Bench question.jsonl, ShareGPT JSON and JSONL, parquet, a saved dataset directory."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eagle3.errors import ConfigError
from eagle3.prompts.sets import load_prompt_set

MT_BENCH = [
    {"question_id": 81, "category": "writing", "turns": ["Write a travel blog post.", "Rewrite it in limericks."]},
    {"question_id": 111, "category": "math", "turns": ["What is 3 + 4 * 2?", "And squared?"]},
    {"question_id": 121, "category": "coding", "turns": ["Write a Python function that reverses a list."]},
]
SHAREGPT = [
    {"id": "s1", "category": "chat", "conversations": [{"from": "human", "value": "Hi there"},
                                                        {"from": "gpt", "value": "Hello!"}]},
    {"id": "s2", "conversations": [{"from": "human", "value": "Explain a hash map"}]},
]


def _summary(ps):
    return [(p.id, p.category, [m["content"] for m in p.messages]) for p in ps.prompts]


def test_mt_bench_question_file_keeps_ids_categories_and_the_first_turn(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in MT_BENCH))
    assert _summary(load_prompt_set(path)) == [("81", "writing", ["Write a travel blog post."]),
                                                ("111", "math", ["What is 3 + 4 * 2?"]),
                                                ("121", "coding", ["Write a Python function that reverses a list."])]


@pytest.mark.parametrize("layout", ["json", "jsonl"])
def test_sharegpt_json_and_jsonl(tmp_path, layout):
    path = tmp_path / f"sharegpt.{layout}"
    path.write_text(json.dumps(SHAREGPT) if layout == "json" else "".join(json.dumps(r) + "\n" for r in SHAREGPT))
    assert _summary(load_prompt_set(path)) == [("s1", "chat", ["Hi there"]), ("s2", None, ["Explain a hash map"])]


def test_parquet_file_and_a_saved_dataset_directory(tmp_path):
    table = pa.Table.from_pylist([{"question_id": r["question_id"], "category": r["category"], "turns": r["turns"]}
                                  for r in MT_BENCH])
    pq.write_table(table, tmp_path / "mt.parquet")
    # datasets' save_to_disk layout: Arrow IPC stream shards plus two JSON files.
    saved = tmp_path / "saved"
    saved.mkdir()
    with pa.OSFile(str(saved / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (saved / "dataset_info.json").write_text("{}")
    (saved / "state.json").write_text('{"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}')
    want = [("81", "writing"), ("111", "math"), ("121", "coding")]
    for path in (tmp_path / "mt.parquet", saved):
        ps = load_prompt_set(path)
        assert [(p.id, p.category) for p in ps.prompts] == want and len(ps.sha256) == 64


@pytest.mark.parametrize("content,message", [
    ('{"id": 1}', "must be a JSON list of rows"),
    ("[{\"turns\": []}]", "1: 'conversations' must be a non-empty list"),
    ("not json", "not valid JSON"),
])
def test_bad_sets_name_the_file_and_the_fix(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as err:
        load_prompt_set(path)
    assert str(path) in str(err.value)


def test_a_directory_without_data_files_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"without \*\.arrow .* or \*\.parquet"):
        load_prompt_set(tmp_path)
