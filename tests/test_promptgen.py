"""The prompt-set generator (`eagle3 make-prompts`): deterministic, distinct, a fixed held-out split
that never overlaps the prompts data generation uses, and the committed set in configs/prompts/generated
is exactly what the generator makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3.errors import ConfigError
from eagle3.prompts import load_prompts
from eagle3.prompts.generate import generate, heldout, write
from tests.conftest import REPO

EAGLE3 = str(Path(sys.executable).parent / "eagle3")
COMMITTED = REPO / "configs" / "prompts" / "generated"


def _texts(rows: list[dict]) -> list[str]:
    return [r["conversations"][-1]["content"] for r in rows]


def test_the_same_arguments_give_the_same_bytes(tmp_path):
    a = write(tmp_path / "a", generate(500, 40, seed=3))
    b = write(tmp_path / "b", generate(500, 40, seed=3))
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    other = write(tmp_path / "c", generate(500, 40, seed=4))
    assert other[0].read_bytes() != a[0].read_bytes()


def test_ids_and_texts_are_distinct_and_the_split_never_overlaps():
    g = generate(4096, 512)
    assert len(g.train) == 4096 and len(g.heldout) == 512
    ids = [r["id"] for r in g.train + g.heldout]
    assert len(set(ids)) == len(ids)
    train, held = _texts(g.train), _texts(g.heldout)
    assert len(set(train)) == len(train) and len(set(held)) == len(held)
    assert not set(train) & set(held)
    assert all(heldout(t) for t in held) and not any(heldout(t) for t in train)
    assert {r["split"] for r in g.train} == {"train"} and {r["split"] for r in g.heldout} == {"heldout"}
    assert len({r["category"] for r in g.train}) >= 8  # varied: every family of templates is drawn


def test_asking_for_more_never_moves_a_prompt_across_the_split():
    small, large = generate(300, 20), generate(3000, 200)
    assert _texts(large.heldout)[:20] == _texts(small.heldout)
    assert _texts(large.train)[:300] == _texts(small.train)
    assert not set(_texts(large.train)) & set(_texts(small.heldout))


def test_impossible_counts_are_refused():
    with pytest.raises(ConfigError, match="--train and --heldout must be at least 1"):
        generate(0, 5)
    with pytest.raises(ConfigError, match="distinct prompts after 50 draws; ask for fewer"):
        generate(10_000, 10, max_draws=50)


def test_committed_set_is_what_the_generator_makes(tmp_path):
    res = subprocess.run([EAGLE3, "make-prompts", str(tmp_path / "set")], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "set" / name).read_bytes() == (COMMITTED / name).read_bytes(), \
            f"configs/prompts/generated/{name} is stale: rerun `eagle3 make-prompts` into a temp dir and copy it"


def test_make_prompts_refuses_a_directory_of_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    res = subprocess.run([EAGLE3, "make-prompts", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "holds other files (notes.txt)" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize("name", ["h200-tiny.yaml", "h200-tiny-online.yaml"])
def test_gpu_profiles_validate_and_benchmark_only_held_out_prompts(name):
    cfg = load_config(REPO / "configs" / name, check_files=False)
    assert cfg.gpus == [0] and cfg.train.dry_run == "never"
    used = set(load_prompts(cfg.datagen.prompts, cfg.datagen.max_samples).ids)
    bench = load_prompts(cfg.bench.prompts)
    assert bench.prompts and not used & set(bench.ids)
    assert not {p.messages[-1]["content"] for p in bench.prompts} & {
        p.messages[-1]["content"] for p in load_prompts(cfg.datagen.prompts).prompts}


CODE_BENCH = REPO / "configs" / "prompts" / "qwen-coder-heldout.jsonl"


def test_a_code_share_makes_code_a_real_part_of_the_data_and_leaves_the_default_sets_alone():
    from eagle3.prompts.generate import CODE_CATEGORIES

    share = lambda rows: sum(r["category"] in CODE_CATEGORIES for r in rows) / len(rows)  # noqa: E731
    plain, coded = generate(4096, 64), generate(4096, 64, code_share=0.6)
    assert share(plain.train) < 0.3 and share(coded.train) > 0.4
    assert all(heldout(t) for t in _texts(coded.heldout)) and not any(heldout(t) for t in _texts(coded.train))
    assert generate(4096, 512).train == generate(4096, 512, code_share=None).train  # the default draws unchanged
    with pytest.raises(ConfigError, match="--code-share 1.5"):
        generate(10, 10, code_share=1.5)


def test_the_code_benchmark_set_holds_tasks_no_training_prompt_asks_for():
    """configs/prompts/qwen-coder-heldout.jsonl (the Qwen2.5-Coder profile's benchmark): its `code-heldout`
    rows name no task of the generator's list, so no training prompt of any generated set asks for them;
    its other rows are held out of the code-share 16k set by the generator's own split; none of its texts
    is a training prompt of that set. (Task names were also kept apart by hand: no held-out task is another
    phrasing of a listed one, e.g. Roman numerals, caches and edit distances are only held out.)"""
    from eagle3.prompts.generate import CODE_TASKS, TASKS

    ps = load_prompts(CODE_BENCH, None)
    cfg = load_config(REPO / "configs" / "h200-qwen-coder.yaml", check_files=False)
    assert cfg.bench.prompts == CODE_BENCH and len(ps.prompts) >= cfg.bench.num_prompts + cfg.bench.warmup_prompts
    measured = ps.prompts[: cfg.bench.num_prompts]
    written = [p for p in measured if p.category == "code-heldout"]
    assert len(written) == cfg.bench.num_prompts // 2  # every other measured row
    for p in written:
        assert not any(task in p.messages[-1]["content"] for task in TASKS + CODE_TASKS), p.messages[-1]["content"]
    generated = generate(16384, 512, 0, code_share=0.6)
    train = set(_texts(generated.train))
    assert not train & {p.messages[-1]["content"] for p in ps.prompts}
    others = [p.messages[-1]["content"] for p in ps.prompts if p.category != "code-heldout"]
    assert others == _texts(generated.heldout)[: len(others)] and all(heldout(t) for t in others)
