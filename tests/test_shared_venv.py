"""A venv shared between clones (the CI cache `.ci/run` links as .venv): `make setup` re-points it
at the clone it runs in, its console scripts name the venv's real path (not a clone's link to it,
which may be gone), and the test suite refuses to run in a clone the venv does not import.

Real make, real pip (the editable install of this pack, --no-deps), real pytest; the venv is a
fresh one with `--system-site-packages` off and the dependency stamp pre-set, so nothing but the
pack itself is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]


def clone(dst: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(dst)], check=True, timeout=120)
    for name in ("Makefile", "pyproject.toml"):  # the working tree's, as the commit under test will hold them
        shutil.copy(REPO / name, dst / name)
    return dst


def make_setup(checkout: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    return subprocess.run(["make", "setup"], cwd=checkout, env=env, capture_output=True, text=True, timeout=300)


def test_a_cached_venv_follows_the_clone_that_sets_it_up_and_names_only_its_own_path(tmp_path):
    cache = tmp_path / "cache" / "venv-pack"
    subprocess.run([sys.executable, "-m", "venv", str(cache)], check=True, timeout=120)
    a, b = clone(tmp_path / "a"), clone(tmp_path / "b")
    for checkout in (a, b):
        (checkout / ".venv").symlink_to(cache)
    (cache / ".deps-stamp").touch()
    os.utime(cache / ".deps-stamp", (2**31, 2**31))  # newer than pyproject.toml: make skips the deps

    res = make_setup(a)
    assert res.returncode == 0, res.stdout + res.stderr
    script = cache / "bin" / "eagle3"
    assert script.read_text().splitlines()[0] == f"#!{cache}/bin/python", "the #! names a clone's link"
    shutil.rmtree(a)  # the clone that installed it is gone: the venv imports no eagle3 until b sets it up
    before = subprocess.run([str(b / ".venv" / "bin" / "python"), "-c", "import eagle3"], cwd="/",
                            capture_output=True, text=True, timeout=60, env=without_pythonpath())
    assert before.returncode != 0 and "No module named 'eagle3'" in before.stderr

    res = make_setup(b)
    assert res.returncode == 0, res.stdout + res.stderr
    imported = subprocess.run([str(cache / "bin" / "python"), "-c", "import eagle3; print(eagle3.__file__)"],
                              cwd="/", capture_output=True, text=True, timeout=60, env=without_pythonpath())
    assert Path(imported.stdout.strip()).resolve() == (b / "eagle3" / "__init__.py").resolve()
    deps = sysconfig.get_paths()["purelib"]  # this suite's venv lends the CLI's dependencies
    started = subprocess.run([str(script), "--help"], cwd="/", capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONPATH": deps})
    assert started.returncode == 0 and "Usage" in started.stdout, started.stderr
    assert script.read_text().splitlines()[0] == f"#!{cache}/bin/python"


def without_pythonpath() -> dict[str, str]:
    """What the venv alone imports (a PYTHONPATH of the caller's, e.g. a worktree's, would decide it)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_suite_refuses_a_venv_that_imports_another_clone(tmp_path):
    other = clone(tmp_path / "other")
    (other / "tests" / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_config.py"],
                         cwd=other, capture_output=True, text=True, timeout=120)
    assert res.returncode == 4, res.stdout + res.stderr
    assert f"imports eagle3 from {REPO}, not from {other}" in res.stdout + res.stderr
    assert "run `make setup` in this checkout first" in res.stdout + res.stderr
    assert " passed" not in res.stdout, "tests ran against the other clone's code"
