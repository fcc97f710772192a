"""The README's tables and the recorded results name the tests that prove each claim
(`reliability/test_faults.py::test_...`, paths relative to tests/): every one must exist, so a
renamed or moved test cannot leave a claim pointing at nothing."""

from __future__ import annotations

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
