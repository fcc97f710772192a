"""datagen.self_prompts without a server: the config's refusal, the fingerprints, the requests' shape. On the
session's shared vLLM CPU server (tests/phases/test_datagen.py): written prompts kept on a resume and
extended, and draws that cannot finish failing only their own prompts. A real model writing its own:
the 2026-12-07 H100 record (bench/RESULTS.md)."""

from __future__ import annotations

import hashlib
import json

import pytest

from eagle3.config import parse_config
from eagle3.errors import ConfigError
from eagle3.config.model import SERVER_UNFINGERPRINTED
from tests.conftest import tiny_raw_config


def test_an_engine_that_cannot_continue_a_user_turn_is_refused_at_validation(tmp_path):
    raw = tiny_raw_config()
    raw["run_dir"] = str(tmp_path / "run")
    raw["engines"]["sglang"] = {"python": raw["engines"]["vllm"]["python"]}
    raw["datagen"].update(engine="sglang", self_prompts={"count": 4})
    with pytest.raises(ConfigError) as err:
        parse_config(raw, tmp_path, check_files=False)
    assert "datagen.self_prompts" in str(err.value) and "set datagen.engine to vllm" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_unset_it_leaves_every_fingerprint_as_it_was_and_set_it_changes_datagens_alone(make_config):
    """A run made before the field existed keeps its done markers: unset, the section hashes as if the
    key were not there. Set, it changes what datagen makes, and nothing downstream is told otherwise."""
    plain = make_config({}, check_files=False)
    dump = plain.model_dump(mode="json", exclude={"datagen": {"server": {"api_key", *SERVER_UNFINGERPRINTED}}})
    del dump["datagen"]["self_prompts"]
    del dump["target"]["data_parallel_size"]  # in no fingerprint
    assert plain.fingerprint("datagen") == hashlib.sha256(json.dumps(
        {"target": dump["target"], "datagen": dump["datagen"]}, sort_keys=True).encode()).hexdigest()[:16]
    writing = make_config({"datagen": {"self_prompts": {"count": 8}}}, check_files=False)
    assert writing.fingerprint("datagen") != plain.fingerprint("datagen")
    assert writing.fingerprint("extract") == plain.fingerprint("extract")


def test_a_written_prompt_may_not_repeat_a_benchmark_prompt_of_any_set_layout(make_config, tmp_path):
    """The benchmark's set is read as the benchmark reads it: a ShareGPT .json list counts, not only JSONL."""
    from eagle3.phases.datagen_self_prompts import texts_taken

    held = tmp_path / "bench-set.json"
    held.write_text(json.dumps([{"id": "b-1", "conversations": [{"from": "human", "value": "Reverse a linked list."}]}]))
    cfg = make_config({"bench": {"prompts": str(held)}})
    done = [{"id": "self-00000", "conversations": [{"role": "user", "content": "Sort a dict by value."},
                                                   {"role": "assistant", "content": "sorted(...)"}]}]
    taken = texts_taken(cfg, done)
    assert {"Reverse a linked list.", "Sort a dict by value."} <= set(taken) and "sorted(...)" not in taken


STEER = "You are a cooking assistant: people ask you for recipes and kitchen advice."


def test_a_prompt_is_written_under_the_steering_system_turn_and_answered_without_it(make_config):
    from eagle3.phases.datagen import build_payload
    from eagle3.phases.datagen_self_prompts import unwritten_prompts, user_turn_payload

    cfg = make_config({"datagen": {"request_extra": {"chat_template_kwargs": {"enable_thinking": False}},
                                   "self_prompts": {"count": 2, "system": STEER, "temperature": 0.7}}},
                      check_files=False)
    prompt = unwritten_prompts(2)[1]
    first, second = (user_turn_payload(cfg, prompt, draw) for draw in (0, 1))
    assert first["messages"] == [{"role": "system", "content": STEER}, {"role": "user", "content": ""}]
    assert (first["continue_final_message"], first["add_generation_prompt"], first["temperature"]) == (True, False, 0.7)
    assert first["chat_template_kwargs"] == {"enable_thinking": False} and first["seed"] != second["seed"]
    answered = build_payload(cfg, prompt.__class__(prompt.id, 0, ({"role": "user", "content": "a written turn"},)))
    assert answered["messages"] == [{"role": "user", "content": "a written turn"}]
    unsteered = make_config({"datagen": {"self_prompts": {"count": 2}}}, check_files=False)
    assert user_turn_payload(unsteered, prompt, 0)["messages"] == [{"role": "user", "content": ""}]
