"""The README's tables and the recorded results name the tests that prove each claim
(`reliability/test_faults.py::test_...`, paths relative to tests/): every one must exist, so a
renamed or moved test cannot leave a claim pointing at nothing, and each must assert something (an
`assert`, `pytest.raises`, or a helper of its module that does), so a claim never cites a test that
cannot fail."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

DOCS = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")), "tests/gpu/RESULTS.md",
        "bench/RESULTS.md", "deployments/README.md"]
REF = re.compile(r"`(?:tests/)?((?:[\w-]+/)*test_\w+\.py)::(test_\w+)")


def refs(doc: Path) -> list[tuple[str, str]]:
    return REF.findall(doc.read_text()) if doc.is_file() else []


def missing(tests_dir: Path, found: list[tuple[str, str]]) -> list[str]:
    out = []
    for path, name in found:
        source = tests_dir / path
        if not source.is_file():
            out.append(f"{path}::{name} (no such file)")
        elif not re.search(rf"^\s*def {name}\(", source.read_text(), re.M):
            out.append(f"{path}::{name} (no such test)")
    return out


def _asserts(node: ast.AST, helpers: dict[str, ast.AST], seen: set[str]) -> bool:
    """Whether a function body asserts, itself or through a function of the same module it calls."""
    for n in ast.walk(node):
        if isinstance(n, ast.Assert):
            return True
        if isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if name in ("raises", "fail", "warns"):
                return True
            if name in helpers and name not in seen:
                seen.add(name)
                if _asserts(helpers[name], helpers, seen):
                    return True
    return False


def without_asserts(tests_dir: Path, found: list[tuple[str, str]]) -> list[str]:
    out = []
    for path, name in found:
        source = tests_dir / path
        if not source.is_file():
            continue
        tree = ast.parse(source.read_text())
        funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        # a fixture the test takes counts too: module-level functions of the same file
        test = funcs.get(name)
        if test is not None:
            args = {a.arg for a in test.args.args}
            if not _asserts(test, funcs, set()) and not any(_asserts(funcs[a], funcs, set()) for a in args if a in funcs):
                out.append(f"{path}::{name} (asserts nothing)")
    return out


def test_every_cited_test_asserts_something():
    found = [ref for doc in DOCS for ref in refs(REPO / doc)]
    bad = sorted(set(without_asserts(REPO / "tests", found)))
    assert not bad, bad


def test_a_cited_test_that_cannot_fail_is_caught(tmp_path):
    (tmp_path / "test_y.py").write_text("def helper():\n    assert 1\n\n\ndef test_ok():\n    helper()\n\n\n"
                                       "def test_stub():\n    print('ran')\n")
    doc = tmp_path / "doc.md"
    doc.write_text("`test_y.py::test_ok`, `test_y.py::test_stub`")
    assert without_asserts(tmp_path, refs(doc)) == ["test_y.py::test_stub (asserts nothing)"]


def test_every_test_a_document_names_exists():
    found = {doc: refs(REPO / doc) for doc in DOCS}
    assert sum(map(len, found.values())) > 50, "the reference pattern no longer matches the documents"
    problems = {doc: m for doc, f in found.items() if (m := missing(REPO / "tests", f))}
    assert not problems, problems


def test_a_moved_or_renamed_test_is_caught(tmp_path):
    (tmp_path / "handoff").mkdir()
    (tmp_path / "handoff" / "test_x.py").write_text("def test_here():\n    pass\n")
    doc = tmp_path / "doc.md"
    doc.write_text("| a | `handoff/test_x.py::test_here`, `test_x.py::test_here`, `handoff/test_x.py::test_gone` |")
    assert missing(tmp_path, refs(doc)) == ["test_x.py::test_here (no such file)",
                                            "handoff/test_x.py::test_gone (no such test)"]
