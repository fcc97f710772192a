"""An engine is one module plus one registry entry: toy_engine.py, registered for the test, serves
the target for datagen and is benchmarked with a drafter by the real phases (run_phase), through the
pack's supervisor, handoff-visible registry and config checks, and nothing else of the pack changes."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3.config import load_config
from eagle3 import engine_registry
from eagle3.errors import ConfigError
from eagle3.phase_runner import run_phase, supervisor
from tests.conftest import write_tiny_config

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "eagle3-tiny"
TOY = {"toy": "tests.engines.toy_engine:ENGINE"}
K, MAX_TOKENS = 3, 12


def _overrides() -> dict:
    server = {"extra_args": [], "startup_timeout_s": 60}
    return {"target": {"model": str(FIXTURES / "target")},
            "engines": {"toy": {"python": sys.executable}},
            "datagen": {"engine": "toy", "max_samples": 6, "concurrency": 3, "server": server,
                        "sampling": {"max_tokens": MAX_TOKENS}},
            "bench": {"engine": "toy", "drafter": str(FIXTURES / "drafter-trained"), "drafter_trained": True,
                      "num_speculative_tokens": [K], "concurrency": [2], "num_prompts": 4, "warmup_prompts": 1,
                      "max_tokens": MAX_TOKENS, "server": server}}


def test_an_engine_from_one_file_runs_datagen_and_bench(tmp_path):
    with engine_registry.using(TOY):
        cfg = write_tiny_config(tmp_path, _overrides())
        sup = supervisor(cfg)
        run_phase(cfg, "datagen", sup)
        run_phase(cfg, "bench", sup)
        assert not sup.registry.entries(), "a toy server or client is still registered"

    rows = [json.loads(line) for line in (cfg.phase_dir("datagen") / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:  # the toy engine's answer: the question's words, cycled to max_tokens
        question, reply = row["conversations"][-2]["content"].split(), row["conversations"][-1]["content"].split()
        assert reply == [question[i % len(question)] for i in range(MAX_TOKENS)]
        assert row["meta"]["token_ids"] == [], "the toy engine does not return token ids, and was not asked to"

    results = json.loads((cfg.phase_dir("bench") / "results.json").read_text())
    assert (results["engine"], results["bench_client"], results["engine_version"]) == \
        ("toy", "toy_engine.py load", "toy-1")
    assert [s["label"] for s in results["servers"]] == ["baseline", f"k={K}"]
    spec = results["servers"][1]
    assert "--draft-model" in spec["argv"] and str(cfg.bench.drafter) in spec["argv"]
    for w in spec["windows"]:  # measured by the toy's own counters: every request n tokens in ceil(n/(K+1)) steps
        steps = w["load"]["completed"] * -(-MAX_TOKENS // (K + 1))
        assert w["traffic_delta"]["generation_tokens"] == w["load"]["total_output_tokens"] == 4 * MAX_TOKENS
        assert w["delta"]["drafts"] == steps and w["delta"]["accepted"] == 4 * MAX_TOKENS - steps
        assert w["acceptance"]["source"] == "toy /metrics spec counter deltas around the window"
    assert results["gate"]["status"] == "passed"
    assert all(s["stop"]["clean"] for s in results["servers"]), "each server ended on its stop signal"


def test_the_doctor_warns_that_an_engine_it_cannot_probe_is_first_seen_at_its_start(tmp_path):
    """The toy engine has no inspect_script: the preflight
    says so (WARN) instead of probing it, and still runs the engine-independent checks after it."""
    from eagle3.doctor import WARN, engine_checks, uninspected_engine

    with engine_registry.using(TOY):
        cfg = write_tiny_config(tmp_path, _overrides(), check_files=False)
        checks = engine_checks(cfg, supervisor(cfg))
        [(fn, args)] = [(fn, args) for fn, args in checks if args[-1:] == ("toy",)]
        assert fn is uninspected_engine
        c = fn(*args)
    assert (c.name, c.status) == ("engine-env:toy", WARN) and "inspect_script" in c.reason
    assert [fn.__name__ for fn, _ in checks][-2:] == ["check_load_generator", "check_trainer"]


def test_another_process_takes_the_engine_from_EAGLE3_ENGINES(tmp_path):
    """Across processes (`eagle3 run` in a subprocess, a Prefect worker's flow runs) an added engine is
    named in the environment: the same config validates with it and is refused without it."""
    with engine_registry.using(TOY):
        write_tiny_config(tmp_path, _overrides(), check_files=False)
    eagle3 = str(Path(sys.executable).parent / "eagle3")
    argv = [eagle3, "validate", str(tmp_path / "config.yaml")]
    env = {k: v for k, v in os.environ.items() if k != engine_registry.ENGINES_ENV} | {"PYTHONPATH": str(REPO)}

    def validate(engines: str | None) -> subprocess.CompletedProcess:
        extra = {engine_registry.ENGINES_ENV: engines} if engines else {}
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env | extra)

    named = validate("toy=" + TOY["toy"])
    assert named.returncode == 0, named.stdout + named.stderr
    unnamed = validate(None)
    assert unnamed.returncode == 2 and "unknown engine 'toy'" in unnamed.stdout + unnamed.stderr
    # A module that cannot be loaded is bad input, named with its fix, not a crash.
    broken = validate("toy=tests.engines.no_such_module:ENGINE")
    said = broken.stdout + broken.stderr
    assert broken.returncode == 2 and "tests.engines.no_such_module:ENGINE (EAGLE3_ENGINES)" in said, said


def test_an_engine_that_is_not_registered_is_named_with_the_known_ones(tmp_path):
    with engine_registry.using(TOY):
        write_tiny_config(tmp_path, _overrides())
    path = tmp_path / "config.yaml"
    with pytest.raises(ConfigError) as err:  # the same YAML, once toy is no longer registered
        load_config(path)
    assert "datagen.engine" in str(err.value) and "unknown engine 'toy'" in str(err.value)
    assert "vllm, sglang" in str(err.value) and "engines.toy" in str(err.value)


# Where the name of a built-in engine may stand as a string in the core: its own module and the registry;
# its own scripts in engine_side/ (run in its interpreter, which cannot import the pack); and
# drafters/formats.py, which defines once the stored names of the drafter layouts and aux-id conventions
# (named for the loaders that define them, and kept in records).
NAMES_ALLOWED = ("engines/{name}.py", "engine_registry.py", "engine_side/inspect_{name}.py", "engine_side/{name}_*.py",
                 "drafters/formats.py")


def _string_constants(path: Path) -> list[tuple[int, str]]:
    import ast

    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_an_engines_name_stands_only_in_its_own_module_and_the_registry():
    core = REPO / "eagle3"
    leaks = []
    for name in engine_registry.BUILTIN:
        allowed = [a.format(name=name) for a in NAMES_ALLOWED]
        for path in sorted(core.rglob("*.py")):
            rel = path.relative_to(core).as_posix()
            if any(fnmatch.fnmatchcase(rel, pattern) for pattern in allowed):
                continue
            leaks += [f"eagle3/{rel}:{line} {value!r}" for line, value in _string_constants(path) if value == name]
    assert leaks == [], "engine facts outside the engine's module (give the Engine an attribute):\n" + "\n".join(leaks)


def test_what_an_engine_leaves_in_dev_shm_is_its_modules_to_say(tmp_path):
    """The handoff's /dev/shm purge takes each registered engine's segment names from its module; an engine
    that cannot be loaded adds none, and nothing of its is removed on a guess."""
    from eagle3.handoff import shm

    stale, live = tmp_path / "toy_seg_999999999_a", tmp_path / f"toy_seg_{os.getpid()}_a"
    for f in (stale, live, tmp_path / "toy_other"):
        f.write_bytes(b"x")
    with engine_registry.using({**TOY, "gone": "no_such_module_anywhere:ENGINE"}):
        names = shm.names_with_engines()
        result = shm.purge(tmp_path, **names)
    assert "toy_seg_*" in names["patterns"] and "vllm*" in names["patterns"] and "sgl_shm_*" in names["patterns"]
    assert result.removed == [stale.name]  # its creator PID is not alive
    assert [k["name"] for k in result.kept] == [live.name] and "creator PID" in result.kept[0]["reason"]
    assert (tmp_path / "toy_other").exists()  # not one of anyone's names
    assert "toy_seg_*" not in shm.names_with_engines()["patterns"]  # unregistered again
