"""The import layering each package's ``__init__`` docstring states: imports point down
only, and the extender and the webhook stand side by side (neither imports the other)."""

from __future__ import annotations

import ast
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
SHARED = frozenset({"child", "backoff"})
ROOMS: dict[str, frozenset[str]] = {
    "extender": frozenset({"memo", "planner", "groups"}),
    "memo": frozenset({"extender", "planner"}),
    "planner": frozenset({"extender", "memo"}),
    "groups": frozenset({"extender"}),
    "mig": frozenset(),
    "defrag": frozenset({"groups"}),
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
