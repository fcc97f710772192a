"""The documentation site builds from docs/ with MkDocs (Material) in --strict mode: a broken link,
a page missing from the nav or a bad config fails the suite (and so CI), not a reader."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

MKDOCS = Path(sys.executable).parent / "mkdocs"


def test_the_docs_site_builds_strictly(tmp_path):
    res = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    pages = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for name in ("config", "reliability", "security", "operations", "pipeline", "GPU"):
        assert f"{name}/index.html" in pages, sorted(pages)
    assert "security-model" in (tmp_path / "site" / "security" / "index.html").read_text()


def test_the_readme_is_short_and_points_into_the_docs():
    readme = (REPO / "README.md").read_text()
    assert readme.count("\n") <= 150, "the README is read in five minutes; move detail into docs/"
    first = readme.splitlines()[:6]
    assert any(line.startswith("make demo") for line in first) and any(line.startswith("make test") for line in first)
    for page in ("docs/config.md", "docs/reliability.md", "docs/security.md", "docs/operations.md"):
        assert page in readme and (REPO / page).is_file()
