"""The phase table: the one declaration everything else derives from, and its swap hook."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from eagle3 import phase_table
from eagle3.errors import ConfigError
from eagle3.phase_table import PIPELINE, Phase

EXTRA = Phase("lint", "bench", "json:dumps", "nothing")


def test_derived_views_follow_the_table(make_config):
    cfg = make_config(check_files=False)
    assert phase_table.names() == ("datagen", "extract", "train", "bench")
    assert [phase_table.next_phase(p) for p in ("start", "datagen", "bench")] == ["datagen", "extract", None]
    assert phase_table.select(from_="train") == ["train", "bench"] and phase_table.select(only="extract") == ["extract"]
    assert [p for p, _, _ in phase_table.servers(cfg)] == ["datagen", "extract", "bench"]
    # train serves nothing offline; under auto/online its step may run extract's server
    assert cfg.phase_ports("train") == [cfg.extract.server.port, *cfg.handoff.extra_ports]
    offline = make_config({"hidden_states": {"mode": "offline"}}, check_files=False)
    assert offline.phase_ports("train") == list(offline.handoff.extra_ports)
    assert cfg.phase_ports("bench")[0] == cfg.bench.server.port
    with phase_table.using((*PIPELINE, EXTRA)):
        assert phase_table.names()[-1] == "lint" and phase_table.next_phase("bench") == "lint"
        assert phase_table.select(from_="bench") == ["bench", "lint"]
        assert cfg.fingerprint("lint") != cfg.fingerprint("bench"), "a phase without a config section fingerprints"
    assert phase_table.names() == ("datagen", "extract", "train", "bench"), "the swap ends with the block"


@pytest.mark.parametrize("rows,message", [
    ((), "non-empty sequence"),
    ((*PIPELINE, replace(EXTRA, upstream="train")), "phase 'lint' has upstream 'train'; it must be the row before it"),
    ((*PIPELINE, replace(EXTRA, name="Lint")), "phase name 'Lint' must be lowercase"),
    ((*PIPELINE, replace(EXTRA, name="start")), "not start, end or run"),
    ((*PIPELINE, replace(EXTRA, name="status")), "a command of the CLI"),
    ((*PIPELINE, replace(EXTRA, name="engines")), "a config section every pipeline has"),
    ((*PIPELINE, replace(EXTRA, outputs=("../x",))), "must be a path inside the phase dir"),
    ((*PIPELINE, replace(EXTRA, run="json.dumps")), "run must be 'module:name'"),
])
def test_a_bad_table_is_refused_naming_the_row(rows, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        with phase_table.using(rows):
            pass


def test_unknown_phase_names_the_option_and_the_choices():
    with pytest.raises(ConfigError, match="--only: unknown phase 'lint'; choose from datagen, extract, train, bench"):
        phase_table.select(only="lint")
    with pytest.raises(ConfigError, match="cannot be combined"):
        phase_table.select(only="train", from_="datagen")


def test_the_environment_hook_is_read_when_the_table_is_asked_for(monkeypatch):
    monkeypatch.setenv(phase_table.TABLE_ENV, "tests.test_phase_table:TABLE")
    assert phase_table.names()[-1] == "lint"  # no re-import: read at call time
    monkeypatch.setenv(phase_table.TABLE_ENV, "tests.test_phase_table:NO_SUCH")
    with pytest.raises(ConfigError, match="EAGLE3_PHASE_TABLE='tests.test_phase_table:NO_SUCH': cannot load"):
        phase_table.names()


def test_the_cli_offers_the_tables_phases_in_a_subprocess():
    env = {"EAGLE3_PHASE_TABLE": "tests.test_phase_table:TABLE", "PATH": "/usr/bin:/bin", "COLUMNS": "300"}
    res = subprocess.run([sys.executable, "-m", "eagle3.cli", "run", "--help"], capture_output=True, text=True,
                         env=env, timeout=60, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    assert res.returncode == 0, res.stderr
    assert "datagen, extract, train, bench, lint" in " ".join(res.stdout.split())


TABLE = (*PIPELINE, EXTRA)
