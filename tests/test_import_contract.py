"""The import contract, read from the source (every import statement, lazy ones included):

  - the core (eagle3/) never imports Prefect, flows/ or tasks/; the one exception is the CLI's
    entry into the flow (`eagle3 run`), inside its function;
  - a phase (eagle3/phases/) never imports the phase runner that runs it, and a phase's module
    (the `run` of its phase-table row) never imports another phase's module, directly or through
    a helper: what one phase reads of another's output is in layout.py or a record module;
  - tasks/ never imports flows/ (a flow composes tasks, not the other way round);
  - the process layer (eagle3/process/) never imports the handoff (eagle3/handoff/), which builds
    on it (the watchdog's NVML memory sample is injected by eagle3.phase_runner.supervisor);
  - no import cycles at all among eagle3/, flows/, tasks/ and deployments/, lazy and type-only
    imports included: every module can be read, and imported, from the bottom up;
  - the folders and modules of eagle3/ sit on the floors docs/DESIGN.md draws: every one is drawn, no import
    points up a floor, and no two of them import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# `eagle3 run` enters the orchestration layer lazily: its API server, the flow, and (fan-out) the pool check.
CLI_FLOW_ENTRY = {("eagle3/cli/flow.py", "flows.local_server"), ("eagle3/cli/flow.py", "flows.pipeline"),
                  ("eagle3/cli/flow.py", "tasks.fanout")}


def imports(path: Path, rel: Path | None = None) -> list[tuple[str, int, bool]]:
    """(absolute module, line, at module level) of every import in the file (at `rel` in the repo)."""
    package = list((rel or path.relative_to(REPO)).parts[:-1])  # a module's package; __init__'s own
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            names = [f"{module}.{a.name}" for a in node.names] if not node.module else [module]
            out += [(m, node.lineno, id(node) in top) for m in names]
    return out


def files(folder: str) -> list[Path]:
    return sorted((REPO / folder).rglob("*.py"))


def under(module: str, *roots: str) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def test_the_core_never_imports_the_orchestrator():
    bad = []
    for path in files("eagle3"):
        rel = str(path.relative_to(REPO))
        for module, line, top in imports(path):
            if not under(module, "prefect", "flows", "tasks"):
                continue
            if (rel, module) in CLI_FLOW_ENTRY and not top:
                continue
            bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "the core must stay Prefect-free:\n" + "\n".join(bad)


def test_phases_never_import_the_phase_runner():
    bad = [f"{p.relative_to(REPO)}:{line} imports {m}" for p in files("eagle3/phases")
           for m, line, _ in imports(p) if under(m, "eagle3.phase_runner")]
    assert not bad, "a phase is run by eagle3.phase_runner; it must not import it back:\n" + "\n".join(bad)


def test_a_phase_never_imports_another_phase():
    from eagle3.phase_table import PIPELINE

    graph = module_graph()
    phases = {p.module for p in PIPELINE}
    bad = []
    for phase in sorted(phases):
        seen, todo = set(), [phase]
        while todo:  # everything the phase's module reaches, inside eagle3.phases
            for dep in graph.get(todo.pop(), ()):
                if dep not in seen and under(dep, "eagle3.phases"):
                    seen.add(dep)
                    todo.append(dep)
        bad += [f"{phase} reaches {other}" for other in sorted(seen & (phases - {phase}))]
    assert len(phases) == 4 and not bad, "\n".join(bad)


def test_tasks_never_import_flows():
    bad = [f"{p.relative_to(REPO)}:{line} imports {m}" for p in files("tasks") for m, line, _ in imports(p)
           if under(m, "flows")]
    assert not bad, "\n".join(bad)


def test_the_process_layer_never_imports_the_handoff():
    bad = []
    for path in files("eagle3/process"):
        rel = str(path.relative_to(REPO))
        for module, line, _ in imports(path):
            if under(module, "eagle3.handoff"):
                bad.append(f"{rel}:{line} imports {module}")
    assert not bad, "eagle3.handoff builds on eagle3.process, not the other way round:\n" + "\n".join(bad)


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolved to the longest module it names)."""
    mods = {}
    for top in ("eagle3", "flows", "tasks", "deployments"):
        for path in files(top):
            if "engine_side" in path.parts:  # scripts run by the engine's interpreter, by path
                continue
            rel = path.relative_to(REPO).with_suffix("")
            mods[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    graph = {}
    for name, path in mods.items():
        deps = set()
        for module, _, _ in imports(path):
            while module and module not in mods:
                module = module.rpartition(".")[0]
            if module and module != name and not name.startswith(module + "."):  # a package's own __init__
                deps.add(module)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_there_are_no_import_cycles():
    found = cycles(module_graph())
    assert not found, "import cycles (break each by moving what both sides need below them):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_cycle_finder_finds_lazy_and_type_only_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles(module_graph() | {"eagle3.errors": {"eagle3.handoff.core"}}), \
        "a type-only import of the handoff from the error taxonomy would close a cycle again"


def test_the_checker_sees_relative_and_lazy_imports(tmp_path):
    """The contract is only as good as the parser: a lazy relative import of the phase runner from a
    phase, and a lazy Prefect import in the core, are both found."""
    src = tmp_path / "probe.py"
    src.write_text("def f():\n    from ..phase_runner import supervisor\n    import prefect.flows\n")
    found = imports(src, Path("eagle3/phases/probe.py"))
    assert ("eagle3.phase_runner", 2, False) in found and ("prefect.flows", 3, False) in found


# ---- the floors of eagle3/, as docs/DESIGN.md draws them --------------------------------------------

OFF_FLOOR = {"engine_side/"}  # scripts run in the engine's interpreter; the core never imports them


def drawn_floors() -> list[list[str]]:
    """docs/DESIGN.md's floors of eagle3/, bottom first: each line between the two `----` lines of its
    layer picture, the folders (`name/`) and modules (`name.py`) it starts with."""
    text = (REPO / "docs" / "DESIGN.md").read_text()
    block = text.split("\n ----\n")[1]
    floors = []
    for line in block.splitlines():
        units = []
        for word in line.split():
            if not (word.endswith("/") or word.endswith(".py")):
                break
            units.append(word)
        floors.append(units)
    return floors[::-1]


def unit_of_file(path: Path) -> str:
    parts = path.relative_to(REPO / "eagle3").parts
    return parts[0] + "/" if len(parts) > 1 else parts[0]


def unit_of_module(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "eagle3":
        return None
    if len(parts) == 1 or parts[1] == "__version__":
        return "__init__.py"
    return parts[1] + "/" if (REPO / "eagle3" / parts[1]).is_dir() else parts[1] + ".py"


def unit_imports() -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> where, for every import across units of the core."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in files("eagle3"):
        a = unit_of_file(path)
        if a in OFF_FLOOR:
            continue
        for module, line, _ in imports(path):
            b = unit_of_module(module)
            if b and b != a:
                out.setdefault((a, b), []).append(f"{path.relative_to(REPO)}:{line}")
    return out


def test_every_folder_and_module_of_the_core_is_on_a_drawn_floor():
    drawn = [u for floor in drawn_floors() for u in floor]
    assert len(drawn) == len(set(drawn)), f"drawn twice: {sorted(u for u in drawn if drawn.count(u) > 1)}"
    present = {unit_of_file(p) for p in files("eagle3")} - OFF_FLOOR
    assert present - set(drawn) == set(), f"not on docs/DESIGN.md's layer picture: {sorted(present - set(drawn))}"
    assert set(drawn) - present == set(), f"drawn but not in eagle3/: {sorted(set(drawn) - present)}"


def test_no_import_points_up_a_floor_and_no_two_units_import_each_other():
    floor = {u: i for i, units in enumerate(drawn_floors()) for u in units}
    edges = unit_imports()
    up = [f"{where[0]}: {a} (floor {floor[a]}) imports {b} (floor {floor[b]})"
          for (a, b), where in sorted(edges.items()) if floor.get(b, -1) > floor.get(a, -1)]
    assert up == [], "imports pointing up docs/DESIGN.md's floors:\n" + "\n".join(up)
    # Across units, not only modules: a folder that imports another which imports it back is one tangle.
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)

    def reaches(x: str, target: str, seen: set[str]) -> bool:
        return any(y == target or (y not in seen and not seen.add(y) and reaches(y, target, seen))
                   for y in graph.get(x, ()))

    tangles = [f"{a} -> {b} ({where[0]}) and back" for (a, b), where in sorted(edges.items()) if reaches(b, a, set())]
    assert tangles == [], "units that import each other:\n" + "\n".join(tangles)
