"""The serve-parity gate's arithmetic and inputs (eagle3/bench/gates.py, eagle3/phases/bench.py), and
where its expectation comes from on a GPU run (the trainer's log -> the train manifest)."""

from __future__ import annotations

import json

import pytest

from eagle3.bench.gates import TRAIN_TO_SERVE_CAUSES, evaluate_parity, expected_length
from eagle3.phases.bench_inputs import parity_expectation, training_prompts
from eagle3.phases.train_log import validation_by_epoch, validation_full_acc

ACC = [0.988, 0.969, 0.951]


def test_expected_length_and_the_requirement():
    assert expected_length(ACC, 3) == pytest.approx(3.908) and expected_length(ACC, 1) == pytest.approx(1.988)
    ok = evaluate_parity(ACC, "cfg", {3: {"acceptance_length": 2.02, "per_position": [0.45, 0.29, 0.27]}}, 0.3, True,
                         {"count": 16, "ids": []})
    assert ok["status"] == "passed" and ok["by_k"]["3"]["required"] == pytest.approx(1.872, abs=1e-3)
    bad = evaluate_parity(ACC, "cfg", {1: {"acceptance_length": 1.01}, 3: {"acceptance_length": 1.02}}, 0.3, True,
                          {"count": 16, "ids": []})
    assert bad["status"] == "failed" and bad["likely_causes"] == TRAIN_TO_SERVE_CAUSES
    assert "k=1: 1.010 < 1.296" in bad["message"] and "k=3: 1.020 < 1.872" in bad["message"]


@pytest.mark.parametrize("expected,trained,measured,why", [
    (ACC, False, {3: {"acceptance_length": 1.0}}, "untrained"),
    (None, True, {3: {"acceptance_length": 1.0}}, "no expectation"),
    (ACC, True, {3: None}, "no parity window"),
])
def test_not_applied_says_why(expected, trained, measured, why):
    gate = evaluate_parity(expected, None, measured, 0.3, trained, None)
    assert gate["status"] == "not applied" and why in gate["message"]


def test_the_sample_is_spread_over_the_training_rows(make_config, tmp_path):
    rows = "".join(json.dumps({"id": f"p{i}", "prompt": f"q{i}"}) + "\n" for i in range(40))
    (tmp_path / "p.jsonl").write_text(rows)
    cfg = make_config({"datagen": {"prompts": str(tmp_path / "p.jsonl"), "max_samples": 32},
                       "bench": {"parity": {"prompts": 4}}}, check_files=False)
    assert [p.id for p in training_prompts(cfg)] == ["p0", "p8", "p16", "p24"]


def test_expectation_from_the_config_or_the_train_manifest(make_config):
    cfg = make_config({"bench": {"parity": {"expected_full_acc": ACC}}}, check_files=False)
    assert parity_expectation(cfg, {"val_full_acc": [0.5]}) == (ACC, "bench.parity.expected_full_acc (config)")
    cfg = make_config(check_files=False)
    got = parity_expectation(cfg, {"val_full_acc": [0.7, 0.5], "train_manifest": "/r/train/manifest.json"})
    assert got == ([0.7, 0.5], "/r/train/manifest.json (val_full_acc from the trainer's log)")
    assert parity_expectation(cfg, {"val_full_acc": None}) == (None, None)


def test_validation_accuracy_is_read_from_the_trainers_log(tmp_path):
    """speculators 0.9 logs one val line per epoch (rich may wrap it); the last epoch's values win."""
    log = tmp_path / "train.log"
    log.write_text("INFO val/loss_epoch=2.2, val/full_acc_0_epoch=0.5, val/full_acc_1_epoch=0.3, epoch=0\n"
                   "INFO val/loss_epoch=1.1, val/full_acc_0_epoch=0.988, val/full_acc_1_epoch=0.969,\n"
                   "          val/full_acc_2_epoch=0.951, epoch=1\n")
    assert validation_full_acc(log) == [0.988, 0.969, 0.951]
    assert validation_by_epoch(log) == [[0.5, 0.3], [0.988, 0.969, 0.951]]  # what each epoch bought
    log.write_text("dry run: no metrics\n")
    assert validation_full_acc(log) is None and validation_full_acc(tmp_path / "missing.log") is None


def test_each_prepared_row_is_traced_to_the_sample_whose_prompt_it_starts_with(tmp_path):
    """prepare-data shuffles and keeps no id: a row is its sample's prompt ids then the answer's."""
    from eagle3.engine_side.index_prepared import prompt_ids_of, sample_of_row

    rows = [{"id": "a", "meta": {"prompt_token_ids": [1, 5, 6]}}, {"id": "b", "meta": {"prompt_token_ids": [1, 5]}},
            {"id": "c", "meta": {"prompt_token_ids": [1, 7, 7, 7]}}, {"id": "d", "meta": {"prompt_token_ids": [1, 7, 7, 7]}},
            {"id": "e", "meta": {"prompt_token_ids": []}}, {"id": "f"}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"id": "g", "me')  # torn last row
    table = prompt_ids_of(tmp_path / "s.jsonl")
    assert sample_of_row([1, 5, 9, 9], table) == "b"       # the prompt it starts with
    assert sample_of_row([1, 5, 6, 9], table) == "a"       # b's prompt is a's prefix: a, the longer, is the row's
    assert sample_of_row([1, 7, 7, 7, 3], table) is None   # two samples share that prompt: not guessed
    assert sample_of_row([2, 5, 6], table) is None and sample_of_row([1], table) is None


def test_the_validation_split_is_the_trainers_last_rows():
    from eagle3.engines.speculators_cli import validation_rows

    assert validation_rows(4096) == range(3686, 4096) and validation_rows(12) == range(10, 12)
    assert validation_rows(100, "0.75") == range(75, 100)
    assert validation_rows(100, "x") == range(90, 100)  # the trainer refuses that value itself


def test_parity_serves_the_drafters_validation_prompts_where_its_record_names_them(make_config, tmp_path):
    from eagle3.phases.bench_inputs import parity_prompts

    rows = "".join(json.dumps({"id": f"p{i}", "prompt": f"q{i}"}) + "\n" for i in range(40))
    (tmp_path / "p.jsonl").write_text(rows)
    cfg = make_config({"datagen": {"prompts": str(tmp_path / "p.jsonl"), "max_samples": 32},
                       "bench": {"parity": {"prompts": 4}}}, check_files=False)
    held = [f"p{i}" for i in (3, 9, 12, 20, 27, 31)] + ["p39", "gone"]  # p39 was never generated, "gone" not a row
    got, kind = parity_prompts(cfg, {"data": {"validation_ids": held}})
    assert kind == "validation" and [p.id for p in got] == ["p3", "p9", "p20", "p27"]
    for drafter in ({"data": {"validation_ids": None}}, {"data": None}, {}, {"data": {"validation_ids": ["gone"]}}):
        got, kind = parity_prompts(cfg, drafter)
        assert kind == "training" and [p.id for p in got] == ["p0", "p8", "p16", "p24"]


def test_parity_serves_the_written_validation_prompts_too(make_config, tmp_path):
    """With datagen.self_prompts a drafter validates on written prompts as well: they stand only in the
    samples, and the gate draws from them like from the file's, so its prompts are a sample of the very
    rows the expectation was measured on (on 2026-12-07 the file's alone served +8.9 % above it)."""
    from eagle3.phases.bench_inputs import parity_prompts

    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"q{i}"}) + "\n" for i in range(8)))
    cfg = make_config({"datagen": {"prompts": str(tmp_path / "p.jsonl"), "max_samples": 4,
                                   "self_prompts": {"count": 4}},
                       "bench": {"parity": {"prompts": 4}}}, check_files=False)
    ids = [f"p{i}" for i in range(4)] + [f"self-{i:05d}" for i in range(4)]
    cfg.layout.samples.parent.mkdir(parents=True)
    cfg.layout.samples.write_text("".join(json.dumps({"id": i, "conversations": [
        {"role": "user", "content": f"written {i}"}, {"role": "assistant", "content": "a"}]}) + "\n" for i in ids))
    got, kind = parity_prompts(cfg, {"data": {"validation_ids": ["p1", "p3", "self-00000", "self-00002"]}})
    assert kind == "validation" and [p.id for p in got] == ["p1", "p3", "self-00000", "self-00002"]
    assert [p.messages for p in got[2:]] == [({"role": "user", "content": "written self-00000"},),
                                             ({"role": "user", "content": "written self-00002"},)]
