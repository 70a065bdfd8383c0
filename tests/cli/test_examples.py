"""The README's examples (issue 36, item 4) run as written on the files in
gpupack/examples: the Pod for explain, the nodes and pods for plan and simulate, the
filter request body for a static serve."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def example_lines() -> list[str]:
    text = (REPO / "README.md").read_text()
    found = re.findall(r"^<!-- examples: [^\n]*-->\n```sh\n(.*?)^```$", text, re.M | re.S)
    assert len(found) == 1
    return [line for line in found[0].splitlines() if line.strip()]


def gpupack(argv: list[str]) -> subprocess.CompletedProcess[str]:
    assert argv[0] == "gpupack"
    return subprocess.run([sys.executable, "-m", "gpupack", *argv[1:]], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


def test_the_examples_are_the_ones_shipped() -> None:
    lines = example_lines()
    files = {m for line in lines for m in re.findall(r"gpupack/examples/[\w.-]+", line)}
    assert files == {f"gpupack/examples/{n}" for n in
                     ("pod.yaml", "nodes.yaml", "pods.yaml", "filter.json")}
    assert all((REPO / f).is_file() for f in files)


def test_explain_plan_and_simulate_run_as_written() -> None:
    lines = example_lines()
    explain, plan, simulate = (shlex.split(line) for line in lines[:3])
    r = gpupack(explain)
    assert r.returncode == 0, r.stderr
    assert "pod speech/asr-7 (class asr): MIG slice nvidia.com/mig-1g.10gb" in r.stdout
    r = gpupack(plan)
    assert r.returncode == 0, r.stderr
    assert "speech/asr-3" in r.stdout
    r = gpupack(simulate)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("cluster: gpupack/examples/nodes.yaml and ")
    assert "| gpupack |" in r.stdout and "| kube-scheduler |" in r.stdout


def test_static_serve_answers_the_example_filter_request() -> None:
    lines = example_lines()
    assert lines[3] == "gpupack serve &"
    curl = shlex.split(lines[4])
    assert curl[0] == "curl" and curl[-1] == "http://127.0.0.1:8888/filter"
    body_file = next(a for a in curl if a.startswith("@"))[1:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "gpupack", "serve", "--port", str(port)],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "gpupack serve did not get ready"
                time.sleep(0.3)
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/filter", data=(REPO / body_file).read_bytes(),
            headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.loads(resp.read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
    # The node gpupack places the pod on, of the two MIG nodes that can take it (the
    # one-node filter, --filter-top 1); the other is not a failed node.
    assert answer["NodeNames"] == ["h100-mig-0"]
    assert answer["FailedNodes"] == {}
    assert answer["Error"] == ""
    assert set(answer["FailedAndUnresolvableNodes"]) == {"l40s-ts-0", "l40s-ts-1",
                                                         "h100-a-0", "h100-a-1"}
