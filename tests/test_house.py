"""The house rules of eagle3/, read from the source: no module over 450 lines, no function over 80,
and module names that never collide (each basename once, so a name says which module it is)."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = [p for p in sorted((REPO / "eagle3").rglob("*.py")) if "engine_side" not in p.parts]
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def test_no_module_is_over_450_lines():
    big = [f"{p.relative_to(REPO)}: {n}" for p in CORE if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not big, "split these by what they hold:\n" + "\n".join(big)


def test_no_function_is_over_80_lines():
    long = []
    for path in CORE:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {n} lines")
    assert not long, "\n".join(long)


def test_module_names_never_collide():
    names = Counter(p.stem for p in CORE if p.stem not in ("__init__", "__main__"))
    twice = sorted(n for n, k in names.items() if k > 1)
    assert not twice, f"module names used twice: {twice}"
    top = {p.stem for p in (REPO / "eagle3").glob("*.py")}
    packages = {p.name for p in (REPO / "eagle3").iterdir() if (p / "__init__.py").exists()}
    assert not top & packages, f"a module and a package of the same name: {sorted(top & packages)}"
