"""tests/install-tools.sh leaves the host with the tools and no daemon: Debian's
prometheus package enables (and on systemd hosts starts) prometheus and, through its
Recommends, prometheus-node-exporter; the tests start Prometheus themselves."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from manifests_helpers import REPO

SCRIPT = REPO / "tests" / "install-tools.sh"
UNITS = ("prometheus", "prometheus-node-exporter")


def installed(unit: str) -> bool:
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status}", unit], capture_output=True,
                         text=True)
    return out.returncode == 0 and "install ok installed" in out.stdout


def enabled_links(unit: str) -> list[Path]:
    etc = Path("/etc")
    links = list(etc.glob(f"systemd/system/*.wants/{unit}.service"))
    links += [p for p in etc.glob(f"rc[2-5].d/S*{unit}") if p.name[3:] == unit]
    return links


def systemd_state(unit: str, what: str) -> str:
    out = subprocess.run(["systemctl", what, f"{unit}.service"], capture_output=True,
                         text=True)
    return out.stdout.strip()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("dpkg-query") is None,
                    reason="the installer changes the host only as root on Debian")
def test_installer_leaves_no_daemon_running_or_enabled() -> None:
    out = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    assert shutil.which("prometheus") and shutil.which("promtool")
    systemd = Path("/run/systemd/system").is_dir() and shutil.which("systemctl")
    for unit in UNITS:
        if not installed(unit):
            continue
        assert enabled_links(unit) == [], f"{unit} is still enabled"
        if systemd:
            assert systemd_state(unit, "is-active") != "active", f"{unit} runs"
            assert systemd_state(unit, "is-enabled") != "enabled", f"{unit} is enabled"
        pidfile = Path(f"/run/{unit}.pid")
        assert not pidfile.exists() or not Path(f"/proc/{pidfile.read_text().strip()}").exists()


STUB_APT = """#!/bin/bash
echo "apt-get $*" >> "$LOG"
if [ "$1" = install ] || [ "${*#*install}" != "$*" ]; then
  # What a package's postinst does: invoke-rc.d asks policy-rc.d before starting.
  if [ -x "$GPUPACK_POLICY_RC_D" ]; then "$GPUPACK_POLICY_RC_D" prometheus start; fi
  echo "policy-rc.d answered $?" >> "$LOG"
fi
"""


def test_fresh_install_forbids_starts_and_skips_recommends(tmp_path: Path) -> None:
    """The install path on a host without prometheus, with apt-get and the service
    tools replaced by recorders (the real install runs in .ci/run)."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for tool in ("bash", "grep", "chmod", "rm", "mkdir", "dirname", "id", "cat", "sh"):
        real = shutil.which(tool)
        assert real is not None
        (stubs / tool).symlink_to(real)
    log = tmp_path / "log"
    recorders = {
        "apt-get": STUB_APT,
        "dpkg-query": "#!/bin/bash\necho 'install ok installed'\n",
        "deb-systemd-helper": '#!/bin/bash\necho "deb-systemd-helper $*" >> "$LOG"\n',
        "update-rc.d": '#!/bin/bash\necho "update-rc.d $*" >> "$LOG"\n',
        "systemctl": '#!/bin/bash\necho "systemctl $*" >> "$LOG"\n',
        "helm": "#!/bin/bash\n", "kubectl": "#!/bin/bash\n",
    }
    for name, text in recorders.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    policy = tmp_path / "policy-rc.d"
    env = {"PATH": str(stubs), "LOG": str(log), "GPUPACK_POLICY_RC_D": str(policy),
           "HOME": str(tmp_path)}
    out = subprocess.run([str(stubs / "bash"), str(SCRIPT)], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    calls = log.read_text().splitlines()
    install = [c for c in calls if c.startswith("apt-get") and " install " in c]
    if os.geteuid() != 0:
        assert install == []  # not root: reported, nothing installed
        return
    assert install and "--no-install-recommends" in install[0]
    assert "policy-rc.d answered 101" in calls
    assert not policy.exists(), "the temporary policy-rc.d must be removed"
    systemd = Path("/run/systemd/system").is_dir()
    for unit in UNITS:
        if systemd:
            assert f"systemctl disable --now {unit}.service" in calls
        else:
            assert f"deb-systemd-helper disable {unit}.service" in calls
