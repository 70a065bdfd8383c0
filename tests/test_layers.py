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


def test_imported_sees_lazy_and_from_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("import os\nfrom kube.x import y\n\ndef f():\n    import webhook.app\n"
                   "    from . import z\n")
    assert imported(src) == {"kube", "webhook"}
