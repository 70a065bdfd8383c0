"""The import layering each package's ``__init__`` docstring states: imports point down
only, and the extender and the webhook stand side by side (neither imports the other)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OURS = frozenset({"packing", "kube", "serving", "scheduler", "webhook", "nodeagent",
                  "gpupack", "sim"})
# What each package may import of the project (besides itself).
ALLOWED: dict[str, frozenset[str]] = {
    "packing": frozenset(),
    "serving": frozenset(),
    "sim": frozenset({"packing"}),  # research: the servers never import it
    "kube": frozenset({"packing"}),
    "nodeagent": frozenset({"packing", "serving", "kube"}),
    "scheduler": frozenset({"packing", "kube", "serving"}),
    "webhook": frozenset({"packing", "kube", "serving"}),
    "gpupack": OURS,
}


def imported(path: Path) -> set[str]:
    """Top-level project packages ``path`` imports, at any depth (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_layer_allows(package: str) -> None:
    wrong = {
        str(path.relative_to(REPO)): sorted(names - ALLOWED[package] - {package})
        for path in sorted((REPO / package).rglob("*.py"))
        if (names := imported(path)) - ALLOWED[package] - {package}
    }
    assert wrong == {}, f"{package} imports above or beside its layer: {wrong}"


# Inside :mod:`scheduler`: one room per system, and what each room may import of the
# others (``scheduler/<room>/__init__.py`` states the same). SHARED are the helpers every
# room may use. Nothing lists ``mig`` or ``defrag``: only the command layer wires them.
SHARED = frozenset({"child", "backoff", "engine"})
ROOMS: dict[str, frozenset[str]] = {
    "extender": frozenset({"memo", "planner"}),
    "memo": frozenset(),
    "planner": frozenset({"memo"}),
    "groups": frozenset({"extender"}),
    "mig": frozenset(),
    "defrag": frozenset({"groups"}),
    "dra": frozenset({"extender", "memo"}),
}


def rooms_imported(path: Path, package: str) -> set[str]:
    """The second names of the ``package.<name>`` modules ``path`` imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from scheduler import mig`` names the room in the alias
            names = ([f"{package}.{a.name}" for a in node.names]
                     if node.module == package else [node.module])
        found.update(n.split(".")[1] for n in names
                     if n.startswith(f"{package}.") and n.count(".") >= 1)
    return found


def test_scheduler_has_exactly_its_rooms_and_shared_helpers() -> None:
    here = {p.stem if p.is_file() else p.name for p in (REPO / "scheduler").iterdir()
            if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert here == set(ROOMS) | SHARED


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_scheduler_room_imports_only_the_rooms_it_may(room: str) -> None:
    wrong = {
        str(path.relative_to(REPO)): sorted(names - ROOMS[room] - SHARED - {room})
        for path in sorted((REPO / "scheduler" / room).rglob("*.py"))
        if (names := rooms_imported(path, "scheduler")) - ROOMS[room] - SHARED - {room}
    }
    assert wrong == {}, f"scheduler.{room} imports a room it may not: {wrong}"


# The background loops (scheduler.engine's users): only the command layer (gpupack)
# makes them, so no room of scheduler starts another's thread or writes on its own.
LOOPS = frozenset({"ReservationBook", "Planner", "Warmer", "MigActuator", "Compactor",
                   "Defragmenter"})


def loops_made(path: Path) -> set[str]:
    """The loop classes ``path`` calls (constructs), by name."""
    made: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(
                f, ast.Attribute) else ""
            if name in LOOPS:
                made.add(name)
    return made


def test_only_the_command_layer_makes_loops() -> None:
    wrong = {str(path.relative_to(REPO)): sorted(made)
             for path in sorted((REPO / "scheduler").rglob("*.py"))
             if (made := loops_made(path))}
    assert wrong == {}, f"loops made outside gpupack/: {wrong}"
    assert loops_made(REPO / "gpupack" / "serve_cmd.py") >= {
        "ReservationBook", "Planner", "MigActuator", "Compactor"}


def test_loops_made_sees_a_constructor_by_name_or_attribute(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from x import Planner\nimport y\np = Planner(c)\nw = y.Warmer(c)\n"
                   "q = Planner\n")
    assert loops_made(src) == {"Planner", "Warmer"}


@pytest.mark.parametrize("helper", sorted(SHARED))
def test_scheduler_shared_helpers_import_no_room(helper: str) -> None:
    assert rooms_imported(REPO / "scheduler" / f"{helper}.py", "scheduler") == set()


def test_imported_sees_lazy_and_from_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom kube.x import y\n\ndef f():\n    import webhook.app\n"
                   "    from . import z\n")
    assert imported(src) == {"kube", "webhook"}


def test_rooms_imported_names_the_room(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import scheduler.mig.loop as l\nfrom scheduler.groups.plugin import G\n"
                   "def f():\n    from scheduler import child\n    import packing.mig\n")
    assert rooms_imported(src, "scheduler") == {"mig", "groups", "child"}


def module_graph() -> dict[str, set[str]]:
    """Every module of the project -> the project modules it imports (lazy ones too)."""
    mods: dict[str, Path] = {}
    for package in sorted(OURS):
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name in mods)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module in mods:
                    deps.add(node.module)
                deps.update(f"{node.module}.{a.name}" for a in node.names
                            if f"{node.module}.{a.name}" in mods)
        graph[name] = deps - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert circles(module_graph()) == []


def test_circles_finds_a_lazy_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


LONG = 600  # lines: a product module longer than this says why in its docstring


def long_without_reason() -> list[str]:
    """Product modules over LONG lines whose docstring does not say why (it names the
    limit: "past 600 lines", "about 900 lines", ...)."""
    out = []
    for package in sorted(OURS):
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text()
            if text.count("\n") <= LONG or "_pb2" in path.name:
                continue
            doc = ast.get_docstring(ast.parse(text)) or ""
            if not re.search(r"\b\d[\d,]* lines\b", doc):
                out.append(f"{path.relative_to(REPO)} ({text.count(chr(10))} lines)")
    return out


def test_a_long_module_says_why_it_is_long() -> None:
    assert long_without_reason() == []


def test_long_without_reason_sees_a_long_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                ) -> None:
    pkg = tmp_path / "packing"
    pkg.mkdir()
    (pkg / "big.py").write_text('"""Many lines of code."""\n' + "x = 1\n" * 700)
    (pkg / "why.py").write_text('"""Past 600 lines as one model."""\n' + "x = 1\n" * 700)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "OURS", frozenset({"packing"}))
    assert long_without_reason() == ["packing/big.py (701 lines)"]
