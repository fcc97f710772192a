"""datagen.self_prompts: the target writes prompts of its own, then answers them. The demo's real
SmolLM2-135M-Instruct on a vLLM CPU server of this module's own writes distinct prompts, and a resume and
a larger count keep every row already written (the tiny random model's draws that cannot finish:
tests/phases/test_datagen.py, on the session's shared server)."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from eagle3.config import parse_config
from eagle3.errors import ConfigError
from eagle3.phases.datagen import DatagenPaths, run_datagen
from eagle3.prompts import load_prompts
from eagle3.config.model import SERVER_UNFINGERPRINTED
from tests.conftest import SHARED_SERVER_KEY, tiny_raw_config
from tests.phases.test_datagen import rows


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


@pytest.mark.slow
@pytest.mark.engine
def test_the_real_model_writes_prompts_of_its_own_and_a_resume_keeps_them(smollm2_model, make_config):
    from tests.ports import free_port

    from eagle3.engines.serving import base_url, start_server
    from eagle3.phase_runner import supervisor

    def config(count: int):
        return make_config({
            "target": {"model": str(smollm2_model), "served_name": "smollm2-135m-instruct"},
            "datagen": {"max_samples": 2, "concurrency": 8, "sampling": {"max_tokens": 16, "temperature": 0.0},
                        "server": {"port": port, "api_key": SHARED_SERVER_KEY},
                        "self_prompts": {"count": count, "max_tokens": 96, "system": STEER}}})

    port = free_port()
    cfg = config(4)
    sup = supervisor(cfg)
    t0 = time.monotonic()
    server = start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
    try:
        url = base_url(cfg.datagen.server)
        got = run_datagen(cfg, None, base_url=url).details
        assert (got["total"], got["samples"], got["failed"]) == (6, 6, 0), got
        paths = DatagenPaths.of(cfg)
        written = [r for r in rows(paths.samples) if r["id"].startswith("self-")]
        assert sorted(r["id"] for r in written) == [f"self-{i:05d}" for i in range(4)]
        turns = [r["conversations"][0]["content"] for r in written]
        given = {p.messages[-1]["content"] for p in load_prompts(cfg.datagen.prompts, None).prompts}
        for r, turn in zip(written, turns):
            assert [m["role"] for m in r["conversations"]] == ["user", "assistant"], r
            assert turn.strip() == turn and len(turn) > 10 and "<|im_" not in turn, turn
            assert r["conversations"][1]["content"] and r["meta"]["completion_tokens"] > 0
        assert len(set(turns)) == 4 and not set(turns) & given

        before = paths.samples.read_bytes()
        again = run_datagen(cfg, None, base_url=url).details
        assert (again["resumed"], again["new_samples"]) == (6, 0) and paths.samples.read_bytes() == before
        more = run_datagen(config(6), None, base_url=url).details
        assert (more["resumed"], more["new_samples"], more["samples"]) == (6, 2, 8)
        after = paths.samples.read_bytes()
        assert after.startswith(before)
        extra = [json.loads(line)["conversations"][0]["content"] for line in after[len(before):].splitlines()]
        assert len(extra) == 2 and not set(extra) & (set(turns) | given)
    finally:
        outcome = server.stop()
    assert outcome.clean and not sup.registry.entries(), f"server start {time.monotonic() - t0:.0f} s ago"
