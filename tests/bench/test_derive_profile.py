"""bench/derive_profile.py: a device session's variant of a committed profile is validated by the pack's
schema before it is written, and a bad `--set` fails on this machine, naming the field, with nothing
written (a typo would otherwise surface minutes into a 30-minute device session)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from eagle3.config import load_config
from eagle3.safe_yaml import load as load_yaml
from tests.conftest import REPO

SCRIPT = REPO / "bench" / "derive_profile.py"


@pytest.fixture
def base(tmp_path):
    path = tmp_path / "h200-smollm2.yaml"
    shutil.copy(REPO / "configs" / "h200-smollm2.yaml", path)
    return path


def derive(base, name, *sets):
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([sys.executable, str(SCRIPT), str(base), name, *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


@pytest.mark.parametrize("name, sets, expect", [
    # the two variants bench/gpu_e2e.sh derives: issue 36's data lever (data-session) and issue 40's 2 GPUs
    ("h200-smollm2-data12k-e4-t0.7", ["datagen.max_samples=12288", "train.epochs=4", "datagen.sampling.temperature=0.7",
                                      "bench.windows=3", "bench.max_windows=3"],
     lambda c: (c.datagen.max_samples, c.train.epochs, c.datagen.sampling.temperature, c.bench.windows,
                c.bench.max_windows) == (12288, 4, 0.7, 3, 3)),
    ("h200x2-smollm2", ["gpus=[0,1]", "target.data_parallel_size=2"],
     lambda c: (list(c.gpus), c.target.data_parallel_size) == ([0, 1], 2)),
])
def test_a_variant_is_the_base_with_its_own_name_run_dir_and_fields(base, name, sets, expect):
    res = derive(base, name, *sets)
    assert res.returncode == 0, res.stderr
    out = base.parent / f".{name}.yaml"
    assert res.stdout.strip() == str(out)
    cfg = load_config(out, check_files=False)
    assert cfg.name == name and cfg.run_dir == (base.parent / ".." / "runs" / name).resolve()
    assert expect(cfg)
    base_cfg = load_config(base, check_files=False)
    assert cfg.target.model == base_cfg.target.model  # the base's relative paths still resolve the same
    # everything not set is the base's, field for field
    derived, original = load_yaml(out.read_text(), "derived"), load_yaml(base.read_text(), "base")
    for section in ("engines", "extract", "handoff"):
        assert derived[section] == original[section]


@pytest.mark.parametrize("sets, named", [
    (["datagen.max_sample=1"], "datagen.max_sample: unknown key"),          # a typo in the leaf
    (["datagn.max_samples=1"], "datagn is not a section"),                  # a typo in the section
    (["train.epochs=-1"], "train.epochs"),                                  # a value the schema refuses
    (["train.epochs"], "dotted.key=VALUE"),                                 # no value at all
])
def test_a_bad_set_exits_2_naming_the_field_and_writes_nothing(base, sets, named):
    res = derive(base, "variant", *sets)
    assert res.returncode == 2
    assert named in res.stderr, res.stderr
    assert not (base.parent / ".variant.yaml").exists()
    assert sorted(p.name for p in base.parent.iterdir()) == ["h200-smollm2.yaml"]  # no temp file left either
