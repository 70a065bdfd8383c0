"""docs/install.md's example `helm install` (issue 36, item 6) renders, with cert-manager
as the certificate's source and the `release` label kube-prometheus-stack's Prometheus
selects on the ServiceMonitors and the PrometheusRule."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from manifests_helpers import CHART, CLUSTER_VERSION, REPO, load_docs, tool

DOC = REPO / "docs" / "install.md"


def install_command() -> list[str]:
    found = re.findall(r"^<!-- install: [^\n]*-->\n```sh\n(.*?)^```$", DOC.read_text(),
                       re.M | re.S)
    assert len(found) == 1, "docs/install.md: one block marked 'install:' expected"
    return shlex.split(found[0].replace("\\\n", " "))


def test_the_documented_install_renders_with_the_release_label(tmp_path: Path) -> None:
    cmd = install_command()
    assert cmd[:4] == ["helm", "install", "gpupack", "manifests/helm/gpupack"]
    sets = [a for i, a in enumerate(cmd) if i and cmd[i - 1] == "--set"]
    assert "tls.source=certManager" in sets
    argv = [tool("helm"), "template", "gpupack", str(CHART), "--namespace", "gpupack",
            "--kube-version", CLUSTER_VERSION]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    objs = load_docs(out.stdout)
    monitors = [o for o in objs if o["kind"] in ("ServiceMonitor", "PrometheusRule")]
    assert {o["kind"] for o in monitors} == {"ServiceMonitor", "PrometheusRule"}
    for o in monitors:
        assert o["metadata"]["labels"].get("release") == "kube-prometheus-stack", o["metadata"]
    assert any(o["kind"] == "Certificate" for o in objs)  # cert-manager's
    image = next(c["image"] for o in objs if o["kind"] == "Deployment"
                 for c in o["spec"]["template"]["spec"]["containers"]
                 if "gpupack" in c["image"])
    assert image.startswith("registry.example.com/gpupack:")
