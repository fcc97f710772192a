"""Datagen's merge of its shards (phases/datagen_shards.py), on shard dirs as the shards leave them:
every prompt at most once, in the prompt set's order, the failed-prompts gate over the whole set,
and a shard dir that is not this run's refused before anything is written."""

from __future__ import annotations

import json

import pytest

from eagle3.errors import GateError
from eagle3.fanout.node import shard_config
from eagle3.slices import Shard
from eagle3.fsio import atomic_write_json
from eagle3.phases.datagen import DatagenPaths, content_settings
from eagle3.phases.datagen_shards import merge_datagen
from eagle3.prompts import load_prompts

N = 10


@pytest.fixture
def run(make_config):
    cfg = make_config({"datagen": {"max_samples": N, "max_failed_fraction": 0.2}}, check_files=False)
    prompts = load_prompts(cfg.datagen.prompts, N)
    shards = [shard_config(cfg, Shard("datagen", i, 2)) for i in range(2)]
    return cfg, prompts, shards


def write_shard(scfg, prompts, ids, settings=None, extra_rows=()):
    paths = DatagenPaths.of(scfg)
    paths.dir.mkdir(parents=True, exist_ok=True)
    rows = [{"id": i, "conversations": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"a-{i}"}]}
            for i in [*ids, *extra_rows]]
    paths.samples.write_text("".join(json.dumps(r) + "\n" for r in reversed(rows)))  # finished out of order
    atomic_write_json(paths.manifest, {"settings": settings or content_settings(scfg, prompts), "endpoint": "x"})
    atomic_write_json(paths.summary, {"new_samples": len(ids), "completion_tokens": 5 * len(ids), "generation_s": 1.0,
                                      "endpoint": f"http://node/{scfg.run_dir.name}"})


def test_the_merge_has_every_prompt_once_in_the_prompt_set_s_order(run):
    cfg, prompts, shards = run
    for i, scfg in enumerate(shards):
        write_shard(scfg, prompts, Shard("datagen", i, 2).take(prompts.ids))
    summary = merge_datagen(cfg, shards)
    rows = [json.loads(line) for line in cfg.layout.samples.read_text().splitlines()]
    assert [r["id"] for r in rows] == prompts.ids
    assert summary.details["samples"] == N and summary.details["new_samples"] == N and summary.details["shards"] == 2
    assert json.loads(DatagenPaths.of(cfg).manifest.read_text())["settings"] == content_settings(cfg, prompts)


def test_a_missing_share_beyond_the_gate_fails_the_phase_after_writing_what_there_is(run):
    cfg, prompts, shards = run
    write_shard(shards[0], prompts, Shard("datagen", 0, 2).take(prompts.ids))
    write_shard(shards[1], prompts, Shard("datagen", 1, 2).take(prompts.ids)[:2])  # 3 of 10 missing > 20 %
    with pytest.raises(GateError, match="3 of 10 prompts have no sample in any shard"):
        merge_datagen(cfg, shards)
    assert len(cfg.layout.samples.read_text().splitlines()) == 7


@pytest.mark.parametrize("case,match", [("foreign", "is not a prompt of that shard's slice"),
                                        ("twice", "appears twice"), ("settings", "other settings")])
def test_a_shard_dir_that_is_not_this_run_s_is_refused_before_anything_is_written(run, case, match):
    cfg, prompts, shards = run
    first, second = (Shard("datagen", i, 2).take(prompts.ids) for i in range(2))
    write_shard(shards[0], prompts, first, extra_rows=[second[0]] if case == "foreign" else
                [first[0]] if case == "twice" else ())
    write_shard(shards[1], prompts, second, settings={"model": "another"} if case == "settings" else None)
    with pytest.raises(GateError, match=match):
        merge_datagen(cfg, shards)
    assert not cfg.layout.samples.exists()
