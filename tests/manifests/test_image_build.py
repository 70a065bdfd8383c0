"""The image is built and run here, without a container daemon (issue 36, item 7):
manifests/image/build.sh builds it with buildah (vfs storage, chroot isolation) on a
Debian base made by mmdebstrap from Debian's packages, installs the lock's wheels with
their hashes checked, and runs `gpupack --version` and the servers' imports in it as the
image's non-root user; the size is printed.

It needs root, buildah and mmdebstrap (tests/install-tools.sh installs them when run as
root) and the network (Debian's mirror, the package index); it skips, saying why, where
any is missing. About 3 minutes on a 2-core machine (docs/install.md, section 2), so it
runs in the suite (.ci/run's 30 minutes hold it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "manifests" / "image" / "build.sh"


def test_image_builds_and_runs_as_its_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("buildah's vfs storage and chroot isolation need root")
    missing = [t for t in ("buildah", "mmdebstrap") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (apt-get install buildah "
                    "mmdebstrap; tests/install-tools.sh does as root)")
    try:
        r = subprocess.run(
            [str(BUILD), "--debian-base", "--wheels", str(tmp_path / "wheels"), "--check",
             "--root", str(tmp_path / "buildah"), "--tag", "localhost/gpupack:test"],
            capture_output=True, text=True, timeout=1500)
    finally:
        # vfs keeps a full copy of every layer: gigabytes, not left behind.
        subprocess.run(["buildah", "--storage-driver", "vfs", "--root",
                        str(tmp_path / "buildah" / "storage"), "--runroot",
                        str(tmp_path / "buildah" / "run"), "rmi", "--all", "--force"],
                       capture_output=True, timeout=300)
        shutil.rmtree(tmp_path / "buildah", ignore_errors=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    assert re.search(r"^gpupack \d+\.\d+\.\d+$", out, re.M), out[-2000:]
    assert "servers import as uid 65532 (" in out
    size = re.search(r"^image localhost/gpupack:test: (.+)$", out, re.M)
    assert size is not None, out[-2000:]
    print(f"image size: {size.group(1)}")
