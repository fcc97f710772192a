"""A fresh clone works: nothing tracked points outside the checkout or into this machine.

A tracked symlink to an absolute path (or one whose relative target climbs out of the repo, or
points at nothing the clone contains) dangles on every other machine: the `.venv` link into
~/.cache did, and `python3 -m venv .venv` then failed on a fresh clone. A tracked text file that
names this machine's home or workspace is the same mistake in another form."""

from __future__ import annotations

import fnmatch
import os
import posixpath
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SYMLINK_MODE = "120000"
# Recorded files that name the machine they were made on, and are never read as paths: raw
# measurement records (the README's numbers are backed by them; everything under bench/results is
# one, copied as the run left it, so a GPU machine's home dir in a log is evidence, not a path) and
# the trainer's own metadata in a fixture checkpoint and in the shipped drafters (`name_or_path`, the
# provenance's source paths on the GPU machine: records no loader here reads as a path; their bytes are
# pinned).
RECORDED = ("tests/gpu/results-*.jsonl", "bench/results/*", "tests/fixtures/bench-history/*.json",
            "tests/fixtures/eagle3-tiny/drafter-trained/config.json", "configs/drafters/*/*.json")


def _git(repo: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True).stdout


def tracked_paths(repo: Path) -> list[str]:
    return [p.decode() for p in _git(repo, "ls-files", "-z").split(b"\0") if p]


def bad_symlinks(repo: Path) -> list[str]:
    """Tracked symlinks (mode 120000) a fresh clone of `repo` would get wrong: an absolute target,
    a relative one that leaves the checkout, or one naming nothing the clone contains. The target
    is read from the index, i.e. what a clone gets, not from this working tree."""
    tracked = tracked_paths(repo)
    present = set(tracked) | {posixpath.dirname(p) for p in tracked} | {
        "/".join(p.split("/")[:i]) for p in tracked for i in range(1, p.count("/") + 1)}
    problems = []
    for line in _git(repo, "ls-files", "-s", "-z").split(b"\0"):
        if not line:
            continue
        meta, path = line.decode().split("\t", 1)
        mode, sha, _stage = meta.split()
        if mode != SYMLINK_MODE:
            continue
        target = _git(repo, "cat-file", "blob", sha).decode()
        if posixpath.isabs(target):
            problems.append(f"{path} -> {target}: absolute target (dangles on any other machine)")
            continue
        resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
        if resolved == ".." or resolved.startswith("../"):
            problems.append(f"{path} -> {target}: resolves outside the checkout")
        elif resolved not in present:
            problems.append(f"{path} -> {target}: dangling (nothing tracked at {resolved})")
    return problems


def machine_needles(repo: Path) -> list[str]:
    """Absolute path prefixes of this machine that no tracked file should contain: the home dir
    (and with it ~/.cache), the checkout itself, and the workspace the checkout sits in, unless
    that is the system's temp dir or / (a clone under /tmp must not make every /tmp/x example fail)."""
    root = Path(repo).resolve()
    needles = {str(root) + "/"}
    home = Path.home().resolve()
    if home != Path("/"):
        needles.add(str(home) + "/")
    workspace = root.parent
    if workspace not in (Path("/"), Path(tempfile.gettempdir()).resolve()):
        needles.add(str(workspace) + "/")
    return sorted(needles)


def machine_paths(repo: Path, needles: list[str], recorded: tuple[str, ...] = ()) -> list[str]:
    """`file:line: needle` for every tracked text file line naming one of `needles`."""
    found = []
    for path in tracked_paths(repo):
        full = Path(repo) / path
        if any(fnmatch.fnmatch(path, pattern) for pattern in recorded) or full.is_symlink() or not full.is_file():
            continue
        data = full.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (weights, pickles): not text a path could be read from
        for n, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            hits = [needle for needle in needles if needle in line]
            if hits:
                found.append(f"{path}:{n}: {hits[0]}")
    return found


# ---- the real checks on this repo -------------------------------------------------------------

def test_no_tracked_symlink_leaves_the_checkout():
    assert bad_symlinks(REPO) == []


def test_no_tracked_text_names_this_machines_paths():
    needles = machine_needles(REPO)
    assert str(Path.home().resolve()) + "/" in needles or Path.home().resolve() == Path("/")
    assert machine_paths(REPO, needles, RECORDED) == [], (
        "tracked files name absolute paths of this machine; use paths relative to the checkout or the config file")


def test_recorded_exceptions_still_exist():
    # An exception for a file that is gone would silently widen what the check lets through.
    tracked = tracked_paths(REPO)
    for pattern in RECORDED:
        assert any(fnmatch.fnmatch(p, pattern) for p in tracked), f"RECORDED pattern {pattern} matches nothing"


# ---- the checkers themselves fail on bad input ------------------------------------------------

@pytest.fixture
def scratch_repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "sub" / "real.txt").write_text("content\n")
    return repo


def _commit_links(repo: Path, links: dict[str, str]) -> None:
    for name, target in links.items():
        os.symlink(target, repo / name)
    _git(repo, "add", "-A")


def test_bad_symlinks_flags_absolute_escaping_and_dangling_links(scratch_repo, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    _commit_links(scratch_repo, {
        "abs": str(outside),                  # exists here, dangles on any other machine
        "escape": "../outside",               # relative, but out of the checkout
        "sub/escape2": "../../outside",
        "dangling": "sub/not-there.txt",
        "ok-file": "sub/real.txt",
        "ok-dir": "sub",
        "sub/ok-up": "../sub/real.txt",
    })
    problems = bad_symlinks(scratch_repo)
    flagged = sorted(p.split(" ->")[0] for p in problems)
    assert flagged == ["abs", "dangling", "escape", "sub/escape2"], problems
    assert any("absolute" in p for p in problems) and any("dangling" in p for p in problems)


def test_bad_symlinks_reads_what_a_clone_gets_not_the_working_tree(scratch_repo, tmp_path):
    _commit_links(scratch_repo, {"venv": str(tmp_path)})
    (scratch_repo / "venv").unlink()
    (scratch_repo / "venv").mkdir()  # the working tree now holds a real dir; the index still the link
    assert [p.split(" ->")[0] for p in bad_symlinks(scratch_repo)] == ["venv"]


def test_machine_paths_flags_home_and_workspace_paths(scratch_repo):
    home = str(Path.home().resolve())
    (scratch_repo / "config.yaml").write_text(f"python: {home}/.cache/eagle3/venv/bin/python\n")
    (scratch_repo / "notes.md").write_text("relative paths only: ../shared/x.md, /tmp/example\n")
    (scratch_repo / "weights.bin").write_bytes(b"\0\0" + f"{home}/x".encode())
    (scratch_repo / "sub" / "record.jsonl").write_text(f'{{"cmd": "{home}/x"}}\n')
    _git(scratch_repo, "add", "-A")
    found = machine_paths(scratch_repo, [home + "/"], recorded=("sub/*.jsonl",))
    assert found == [f"config.yaml:1: {home}/"]


def test_machine_needles_skip_a_clone_in_the_temp_dir(tmp_path):
    clone = Path(tempfile.gettempdir()) / "fresh-clone-xyz"
    needles = machine_needles(clone)
    assert str(clone.resolve()) + "/" in needles
    assert str(Path(tempfile.gettempdir()).resolve()) + "/" not in needles
