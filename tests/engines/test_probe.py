"""The engine probe's caches (eagle3/engines/probe.py): per run dir, and per user for a venv
interpreter keyed by its site-packages; a user cache that others could have written is not read."""

from __future__ import annotations

from pathlib import Path

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


def _fake_venv(root):
    """A venv of its own (pyvenv.cfg, bin/python, an empty site-packages) on this interpreter: the probe
    script it runs (engine_versions.py) needs nothing installed."""
    import os
    import sys
    import sysconfig

    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (root / "pyvenv.cfg").write_text(f"home = {os.path.dirname(os.path.realpath(sys.executable))}\n")
    site = root / "lib" / f"python{sysconfig.get_python_version()}" / "site-packages"
    site.mkdir(parents=True)
    return root / "bin" / "python", site


def test_a_rerun_reuses_the_answer_until_the_venv_the_target_or_the_engine_env_changes(make_config, tmp_path,
                                                                                         monkeypatch):
    """Issue 39: a rerun in the same run dir asks the engine nothing again; an install into the engine's
    venv, another target config or another engine env makes it ask again."""
    import json

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    python, site = _fake_venv(tmp_path / "venv")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))

    def ask(env_vars: dict | None = None) -> bool:
        cfg = make_config({"target": {"model": str(model)},
                           "engines": {"speculators": {"python": str(python), "env": env_vars or {}}}},
                          run_dir=tmp_path / "run", check_files=False)
        log = cfg.layout.doctor / "speculators-engine_versions.log"
        log.unlink(missing_ok=True)
        answer = probe.engine_probe(cfg, Supervisor(cfg.layout.state), "speculators", "engine_versions.py")
        assert "versions" in answer, answer
        return log.exists()

    assert ask() and not ask(), "asked once, then the run dir's answer"
    (site / "newly_installed_pkg").mkdir()  # what `pip install` into the engine's venv does to site-packages
    assert ask() and not ask()
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 4096}))
    assert ask() and not ask()
    assert ask({"TOKENIZERS_PARALLELISM": "false"}) and not ask({"TOKENIZERS_PARALLELISM": "false"})


def test_a_wrapper_interpreter_is_known_by_its_content_not_by_when_it_was_written(make_config, tmp_path,
                                                                                   monkeypatch):
    """bench/gpu_e2e.sh writes its engine wrappers (`#!/bin/sh`, the engine's site dir on PYTHONPATH, exec
    python3) again before every run: keyed by the file's mtime, every rerun on the H200 asked the engines
    again (run6's doctor logs: each probe launched twice). The same content keeps the answer; another
    content (another site dir, another interpreter) asks again."""
    import os
    import sys

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    wrapper = tmp_path / "engine-bin" / "python"
    wrapper.parent.mkdir()

    def write(site: str) -> None:
        wrapper.write_text(f'#!/bin/sh\nexport PYTHONPATH="{site}"\nexec {os.path.realpath(sys.executable)} "$@"\n')
        wrapper.chmod(0o755)

    def ask() -> bool:
        cfg = make_config({"engines": {"speculators": {"python": str(wrapper)}}}, run_dir=tmp_path / "run",
                          check_files=False)
        log = cfg.layout.doctor / "speculators-engine_versions.log"
        log.unlink(missing_ok=True)
        answer = probe.engine_probe(cfg, Supervisor(cfg.layout.state), "speculators", "engine_versions.py")
        assert "versions" in answer, answer
        return log.exists()

    write("/opt/site-a")
    assert ask() and not ask()
    mtime = wrapper.stat().st_mtime_ns
    write("/opt/site-a")  # the same wrapper written again, later
    os.utime(wrapper, ns=(mtime + 10**9, mtime + 10**9))
    assert not ask(), "the same wrapper, written again, asks nothing"
    write("/opt/site-b")
    assert ask() and not ask(), "another wrapper asks again"


def test_cached_only_answers_from_the_cache_and_never_runs_the_probe(make_config, tmp_path, monkeypatch):
    """A server start asks for the engine's versions (its compile cache key) this way: it must never wait
    on a probe, and it gets the preflight's answer once there is one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cfg = make_config(run_dir=tmp_path / "r", check_files=False)
    sup = Supervisor(cfg.layout.state)
    log = cfg.layout.doctor / "speculators-engine_versions.log"
    assert probe.engine_probe(cfg, sup, "speculators", "engine_versions.py", cached_only=True) is None
    assert not log.exists()
    answer = probe.engine_probe(cfg, sup, "speculators", "engine_versions.py")
    log.unlink()
    assert probe.engine_probe(cfg, sup, "speculators", "engine_versions.py", cached_only=True) == answer
    assert not log.exists()


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(900)
def test_the_probe_leaves_vllms_inspection_answers_where_every_server_start_reads_them(tmp_path, monkeypatch):
    """Issue 39: the doctor's probe loads the target's class anyway, so vLLM's own code writes its
    model-inspection answers there (the target's class and the EAGLE-3 drafter's) into the compile cache's
    directory for this vLLM version; a first start under new flags then finds them instead of importing
    torch and vLLM once more in a subprocess to inspect each class (vLLM writes an answer only on a miss)."""
    import json

    from eagle3.engines import compile_cache
    from eagle3.engines.serving import start_server
    from eagle3.process.services import state_dir_for
    from tests.conftest import write_tiny_config
    from tests.ports import free_port

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no answer from any earlier probe or start
    cfg = write_tiny_config(tmp_path / "cfg", {"datagen": {"server": {
        "port": free_port(), "extra_args": ["--enforce-eager", "--seed", "4242"]}}})
    sup = Supervisor(state_dir_for(cfg.run_dir))
    answer = probe.inspect_engine(cfg, sup, "vllm")
    target, drafter = "vllm-model_executor-models-llama-LlamaForCausalLM.json", \
        "vllm-model_executor-models-llama_eagle3-Eagle3LlamaForCausalLM.json"
    assert {target, drafter} <= set(answer["modelinfos"]), answer.get("modelinfos")
    shared = compile_cache.shared_dir(compile_cache.user_root(), "vllm", answer["versions"]) / "modelinfos"
    written = {p.name: p.stat().st_mtime_ns for p in shared.glob("*.json")}
    assert {target, drafter} <= set(written)
    assert {"hash", "modelinfo"} <= set(json.loads((shared / target).read_text()))
    assert all(p.stat().st_mode & 0o077 == 0 for p in shared.glob("*.json"))
    assert not (cfg.layout.doctor / "vllm-for-starts").exists()  # the run's scratch is gone once adopted
    proc = start_server(sup, cfg, "datagen", "vllm", cfg.datagen.server)
    proc.stop()
    row = json.loads(cfg.layout.server_starts.read_text().splitlines()[-1])
    assert Path(row["compile_cache"]["shared"]) / "modelinfos" == shared and not row["compile_cache"]["reused"]
    assert {p.name: p.stat().st_mtime_ns for p in shared.glob("*.json")} == written  # found, not inspected again
