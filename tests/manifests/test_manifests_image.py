"""The image's inputs (docker itself does not run here; .github/workflows/release.yml
builds and smoke-tests the image on tags): the lock holds every server dependency of
pyproject.toml with hashes and no plotting stack, the Dockerfile is multi-stage on a
pinned base and installs only the lock, the build context lets every package in, and the
release workflow builds both architectures and publishes the digest."""

from __future__ import annotations

import re
import tomllib

import yaml
from manifests_helpers import MANIFESTS, REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

IMAGE = MANIFESTS / "image"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def locked() -> dict[str, list[Version]]:
    """name -> pinned versions (several when markers split them by platform)."""
    text = (IMAGE / "requirements.lock").read_text()
    pins: dict[str, list[Version]] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", text):
        m = re.match(r"([A-Za-z0-9_.-]+)==([^\s;\\]+)", block)
        if not m:
            continue
        assert "--hash=sha256:" in block, f"{m.group(1)} is pinned without a hash"
        pins.setdefault(canonicalize_name(m.group(1)), []).append(Version(m.group(2)))
    return pins


def test_lock_pins_every_server_dependency() -> None:
    pins = locked()
    for spec in PYPROJECT["project"]["dependencies"]:
        req = Requirement(spec)
        versions = pins.get(canonicalize_name(req.name))
        assert versions, f"{req.name} is not in requirements.lock: run manifests/image/lock.sh"
        for v in versions:
            assert req.specifier.contains(v, prereleases=True), f"{req.name}=={v} vs {spec}"


def test_lock_has_no_plotting_stack() -> None:
    pins = locked()
    for extra in PYPROJECT["project"]["optional-dependencies"]["sim"]:
        assert canonicalize_name(Requirement(extra).name) not in pins


def test_dockerfile_is_multi_stage_on_a_pinned_base() -> None:
    text = (IMAGE / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    # An exact Python patch release on a named Debian release (or a digest).
    assert re.fullmatch(r"python:3\.11\.\d+-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?",
                        base), base
    stages = re.findall(r"^FROM (\S+)(?: AS (\w+))?$", text, re.M)
    assert [s[0] for s in stages] == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]
    assert "--require-hashes" in text and "requirements.lock" in text
    runtime = text.split(stages[-1][0], 2)[-1].split("\nFROM ")[-1]
    assert "USER 65532:65532" in runtime and "COPY --from=build /opt/gpupack" in runtime


def test_build_context_lets_every_package_in() -> None:
    allowed = {line[1:] for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    includes = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in includes:
        pkg = pattern.rstrip("*")
        if (REPO / pkg).is_dir():
            assert pkg in allowed, f"{pkg} is a package but .dockerignore keeps it out"
    assert {"pyproject.toml", "README.md", "manifests/image/requirements.lock"} <= allowed


def test_release_workflow_builds_both_architectures_and_publishes_the_digest() -> None:
    wf = yaml.safe_load((REPO / ".github" / "workflows" / "release.yml").read_text())
    # PyYAML reads the key `on` as True.
    assert wf[True]["push"]["tags"] == ["v*.*.*"]
    steps = wf["jobs"]["image"]["steps"]
    build = next(s for s in steps if s.get("uses", "").startswith("docker/build-push-action"))
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["file"] == "manifests/image/Dockerfile" and build["with"]["push"]
    assert wf["jobs"]["image"]["outputs"]["digest"] == "${{ steps.build.outputs.digest }}"
    text = (REPO / ".github" / "workflows" / "release.yml").read_text()
    assert "steps.build.outputs.digest" in text.split("Publish the digest")[1]
