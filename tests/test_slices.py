"""Shard slices: disjoint, covering, balanced, and the same as speculators' own split of a prepared
dataset (its generate-offline-data --world-size/--rank), so a sharded extraction writes exactly the
files the pack's merge expects from each shard."""

from __future__ import annotations

import json
import subprocess

import pytest

from eagle3.slices import Shard, contiguous
from tests.conftest import ENGINE_PYTHON, requires_engine

CASES = [(0, 1), (1, 1), (1, 3), (7, 2), (12, 2), (13, 4), (100, 7), (5, 8)]


@pytest.mark.parametrize("total,count", CASES)
def test_slices_are_disjoint_cover_everything_and_differ_by_at_most_one(total, count):
    parts = [contiguous(total, i, count) for i in range(count)]
    flat = [i for p in parts for i in p]
    assert flat == list(range(total))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_a_shard_takes_its_part_of_a_list_in_order():
    ids = [f"p{i}" for i in range(7)]
    assert [Shard("datagen", i, 3).take(ids) for i in range(3)] == [ids[0:3], ids[3:5], ids[5:7]]


@pytest.mark.parametrize("index,count", [(-1, 2), (2, 2), (0, 0)])
def test_a_bad_shard_is_refused(index, count):
    with pytest.raises(ValueError, match="index must be in"):
        Shard("datagen", index, count)


@requires_engine
@pytest.mark.engine
def test_speculators_splits_its_dataset_the_same_way():
    probe = ("import json,sys\nfrom speculators.data_generation.offline import get_indices_to_process as g\n"
             f"print(json.dumps([[g(t, None, [], c, r) for r in range(c)] for t, c in {CASES!r}]))")
    out = subprocess.run([str(ENGINE_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    ours = [[list(contiguous(t, r, c)) for r in range(c)] for t, c in CASES]
    assert theirs == ours
