""".ci/run: caches the two venvs when it can, works on a fresh clone when it cannot, and runs `make test`.

The script runs for real (bash, python3 -m venv, ln) in a copy of the checkout's layout; only
`make` is a stand-in on PATH that records its arguments and what .venv / .venv-engine were when it
started (the real `make test` is the whole suite)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO

FAKE_MAKE = """#!/usr/bin/env bash
{ echo "args: $*"
  for v in .venv .venv-engine; do
    if [ -L "$v" ]; then echo "$v link $(readlink "$v")"; elif [ -d "$v" ]; then echo "$v dir"; else echo "$v missing"; fi
  done; } > make.calls
"""


def run_ci(checkout: Path, tmp_path: Path, cache: str | None) -> subprocess.CompletedProcess:
    (checkout / ".ci").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / ".ci" / "run", checkout / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "make").write_text(FAKE_MAKE)
    (bin_dir / "make").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("EAGLE3_CACHE", "PYTEST_ARGS")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["HOME"] = str(tmp_path / "home")  # the default cache, if used, lands in the test's tmp dir
    if cache is not None:
        env["EAGLE3_CACHE"] = cache
    return subprocess.run(["bash", str(checkout / ".ci" / "run")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


def calls(checkout: Path) -> list[str]:
    return (checkout / "make.calls").read_text().splitlines()


def test_fresh_clone_with_an_empty_cache_builds_and_links_the_cached_venvs(tmp_path):
    checkout, cache = tmp_path / "clone", tmp_path / "cache" / "eagle3"
    res = run_ci(checkout, tmp_path, str(cache))
    assert res.returncode == 0, res.stderr
    assert calls(checkout) == ["args: test PYTEST_ARGS=-p no:cacheprovider",
                               f".venv link {cache}/venv-pack", f".venv-engine link {cache}/venv-engine"]
    for name in ("venv-pack", "venv-engine"):
        assert os.access(cache / name / "bin" / "python", os.X_OK), f"{name} was not created in the cache"


def test_without_a_usable_cache_nothing_is_linked_and_make_builds_in_place(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    for cache in ("none", str(blocker / "cache")):  # disabled; cannot be created
        checkout = tmp_path / f"clone-{len(list(tmp_path.glob('clone-*')))}"
        res = run_ci(checkout, tmp_path, cache)
        assert res.returncode == 0, res.stderr
        assert "no venv cache" in res.stdout
        assert calls(checkout) == ["args: test PYTEST_ARGS=-p no:cacheprovider", ".venv missing", ".venv-engine missing"]


def test_a_real_venv_in_the_checkout_is_kept_and_a_dangling_link_is_repaired(tmp_path):
    checkout, cache = tmp_path / "clone", tmp_path / "cache"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (cache / "venv-engine" / "bin").mkdir(parents=True)
    os.symlink("/bin/true", cache / "venv-engine" / "bin" / "python")  # an existing cached venv is reused as is
    os.symlink(tmp_path / "gone", checkout / ".venv-engine")  # a link whose target was deleted
    res = run_ci(checkout, tmp_path, str(cache))
    assert res.returncode == 0, res.stderr
    assert calls(checkout)[1:] == [".venv dir", f".venv-engine link {cache}/venv-engine"]
    assert not (cache / "venv-pack").exists(), "a cached pack venv was built although the checkout has its own"
