"""The engine probe's caches (eagle3/engines/probe.py): per run dir, and per user for a venv
interpreter keyed by its site-packages; a user cache that others could have written is not read."""

from __future__ import annotations

import pytest

from eagle3.engines import probe
from eagle3.process.services import Supervisor
from tests.conftest import engine_available

pytestmark = pytest.mark.skipif(not engine_available(), reason="engine venv missing: run `make engine-env`")


def _ask(make_config, tmp_path, name: str):
    cfg = make_config(run_dir=tmp_path / name, check_files=False)
    answer = probe.engine_probe(cfg, Supervisor(cfg.layout.state), "speculators", "engine_versions.py")
    ran = (cfg.layout.doctor / "speculators-engine_versions.log").exists()
    return answer, ran


def test_a_new_run_dir_reuses_the_users_answer_for_the_same_venv(make_config, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first, ran_first = _ask(make_config, tmp_path, "a")
    second, ran_second = _ask(make_config, tmp_path, "b")
    assert ran_first and not ran_second and first == second and first["versions"].get("speculators")
    users = tmp_path / "cache" / "eagle3" / "engine-probes.json"
    assert users.stat().st_mode & 0o022 == 0


def test_a_user_cache_others_can_write_is_not_trusted(make_config, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _ask(make_config, tmp_path, "a")
    users = tmp_path / "cache" / "eagle3" / "engine-probes.json"
    users.chmod(0o666)
    _, ran = _ask(make_config, tmp_path, "b")
    assert ran, "the probe must run again rather than read a file another user could have written"
