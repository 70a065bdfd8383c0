"""The test tree itself: pytest's default import mode puts each test
directory on ``sys.path`` and imports test modules by basename, so two test
files with the same name in different folders break collection on a clean
checkout (a stale ``__pycache__`` hides it locally)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent


def test_test_module_basenames_are_unique() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name != "conftest.py")
    dupes = sorted(n for n, c in names.items() if c > 1)
    assert dupes == [], f"test modules sharing a basename: {dupes}"
