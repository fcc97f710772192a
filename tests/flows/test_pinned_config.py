"""One validated config per run, and one upstream rule, through the real flow on the session's Prefect
server (instant phases): an edit to the YAML mid-run does not reach that run's later phases, the next
run says which fingerprints changed and redoes only those phases, and every phase's Prefect cache key
is its done marker's key, a bench with a drafter of its own included."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import noop_phases
import pytest
import yaml
from flowkit import PHASES, config, params, run_logs, task_runs
from noop_phases import counts

from eagle3 import phase_table
from eagle3.config import load_config
from eagle3.phase_runner import done_key

pytestmark = [pytest.mark.timeout(300)]


@pytest.fixture
def noop_table():
    with phase_table.using(noop_phases.TABLE):
        yield


def markers(run_dir: Path) -> dict[str, dict]:
    return {p: json.loads((run_dir / "state" / f"{p}.done.json").read_text()) for p in PHASES}


def assert_cache_keys_are_marker_keys(cfg, flow_run_id, done: dict[str, dict]) -> None:
    """Each phase's task ran, and its cached result is stored under its done marker's key (Prefect names
    a result record by its cache key)."""
    assert set(PHASES) <= set(task_runs(flow_run_id))
    stored = {p.name for p in (cfg.run_dir / "state" / "prefect-results").iterdir()}
    for phase, marker in done.items():
        assert f"eagle3-{cfg.name}-{phase}-{done_key(cfg, phase, marker['upstream'])}" in stored, (phase, stored)


def test_an_edit_mid_run_does_not_reach_that_run_and_the_next_run_names_it(prefect_server, noop_table, tmp_path):
    from flows.pipeline import eagle3_pipeline

    path, run_dir = config(tmp_path, "pinned")
    edit = {"train": {"epochs": 7}, "bench": {"num_prompts": 5}}
    run_dir.mkdir()
    (run_dir / "knobs.json").write_text(json.dumps({"edit_yaml": {"datagen": [path, edit]}}))
    before = load_config(path)

    state = eagle3_pipeline(**params(path), return_state=True)
    assert state.is_completed(), state
    assert load_config(path).train.epochs == 7, "the YAML was edited while datagen ran"
    done = markers(run_dir)
    for phase in PHASES:  # train and bench ran after the edit, with the config the run started with
        assert done[phase]["config"] == before.fingerprint(phase), phase
    run_id = state.state_details.flow_run_id
    pinned = run_dir / "state" / "configs" / f"{run_id}.yaml"
    assert stat.S_IMODE(pinned.stat().st_mode) == 0o600
    assert load_config(pinned).train.epochs == 1
    assert json.loads((run_dir / "state" / "run.json").read_text())["pinned_config"] == str(pinned)
    assert_cache_keys_are_marker_keys(before, run_id, done)

    (run_dir / "knobs.json").unlink()
    state = eagle3_pipeline(**params(path), return_state=True)
    assert state.is_completed(), state
    said = [r.message for r in run_logs(state.state_details.flow_run_id) if "config changed since" in r.message]
    assert any(f"train: config fingerprint {before.fingerprint('train')} -> " in m and "train.epochs: 1 -> 7" in m
               for m in said), said
    assert any("bench: config fingerprint" in m and "bench.num_prompts: 16 -> 5" in m for m in said), said
    assert not [m for m in said if "datagen:" in m or "extract:" in m], said
    assert counts(run_dir) == {"datagen": 1, "extract": 1, "train": 2, "bench": 2}, "only the edited phases redone"


def test_a_bench_with_its_own_drafter_is_keyed_as_its_marker(prefect_server, noop_table, tmp_path):
    """Its upstream is none (it serves bench.drafter, not train's output): the cache key must say so too,
    also when train ran in the same flow run."""
    from flows.pipeline import eagle3_pipeline

    path, run_dir = config(tmp_path, "own-drafter")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"architectures": ["Eagle3Speculator"]}))
    raw = yaml.safe_load(Path(path).read_text())
    raw["bench"]["drafter"] = str(drafter)
    Path(path).write_text(yaml.safe_dump(raw))

    state = eagle3_pipeline(**params(path), return_state=True)
    assert state.is_completed(), state
    done = markers(run_dir)
    assert done["bench"]["upstream"] is None and done["train"]["upstream"] == done["extract"]["fingerprint"]
    assert_cache_keys_are_marker_keys(load_config(path), state.state_details.flow_run_id, done)
