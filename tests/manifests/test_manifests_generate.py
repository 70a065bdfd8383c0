"""manifests/generate.py: the managed resources are exactly the catalog's; the
generated dashboards, rules and chart files are up to date."""

from __future__ import annotations

import subprocess
import sys

from manifests_helpers import CHART, MANIFESTS, REPO

from packing.catalog import CATALOG, profile_from_resource


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(MANIFESTS / "generate.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_resources_are_the_catalogs() -> None:
    out = run("resources")
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert names[:2] == ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    assert len(names) == len(set(names))
    expected = {p.resource_name for m in CATALOG.values() if m.mig for p in m.mig.profiles}
    assert set(names[2:]) == expected
    # Every name maps back to a profile (the device plugin's '+' -> '.' spelling).
    for name in names[2:]:
        profile = profile_from_resource(name)
        assert profile is not None and any(
            m.mig.has_profile(profile) for m in CATALOG.values() if m.mig), name
    chart_list = (CHART / "files" / "managed-resources.txt").read_text().split()
    assert chart_list == names


def test_generated_files_up_to_date() -> None:
    out = run("check")
    assert out.returncode == 0, out.stderr


def test_managed_resources_yaml() -> None:
    out = run("managed-resources")
    assert out.returncode == 0 and "ignoredByScheduler: false" in out.stdout
