"""A local monitoring stack for the manifest tests: a real Prometheus server (Debian's
``prometheus``) scraping a real ``gpupack serve`` (static snapshot of the bundled example
cluster), the real ``gpupack webhook`` over HTTPS (certificate from
``manifests/tls/make-self-signed.sh``, verified as its ServiceMonitor says) and the real
node agent on the recorded fake NVML (``fake_agent.py``).

The Prometheus job names and the agent target's ``node`` label are the ones the
ServiceMonitors of ``manifests/`` produce in a cluster (job = Service name; ``node`` from
the pod's node by relabeling), so the dashboards' and alerts' queries run unchanged.
Everything listens on 127.0.0.1 ports picked free.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "gpupack" / "examples"
EXTENDER_JOB = "gpupack-scheduler-metrics"  # Service of manifests/base/scheduler.yaml
AGENT_JOB = "gpupack-node-agent"  # Service of manifests/base/node-agent.yaml
WEBHOOK_JOB = "gpupack-webhook"  # Service of manifests/base/webhook.yaml
WEBHOOK_DNS = "gpupack-webhook.gpupack.svc"  # serverName of its ServiceMonitor
AGENT_NODE = "gpu-node-1"
RATE_INTERVAL = "1m"  # what Grafana's $__rate_interval becomes in the tests


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_json(url: str, body: Any | None = None, timeout: float = 10.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def wait_http(url: str, deadline_s: float, proc: subprocess.Popen[bytes] | None = None,
              context: ssl.SSLContext | None = None) -> None:
    end = time.monotonic() + deadline_s
    last: Exception | None = None
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer 200 within {deadline_s}s: {last}")


def substitute(expr: str) -> str:
    """A dashboard query as Prometheus evaluates it once Grafana filled its variables."""
    return expr.replace("$__rate_interval", RATE_INTERVAL)


@dataclass
class Stack:
    workdir: Path
    prom_url: str = ""
    extender_url: str = ""
    agent_url: str = ""
    webhook_url: str = ""
    ca_file: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    bound: set[str] = field(default_factory=set)  # pods this stack bound

    # -- Prometheus HTTP API ---------------------------------------------------------------

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; raises on a PromQL error. Returns the result vector/matrix."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = f"{self.prom_url}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            out = http_json(url)
        except urllib.error.HTTPError as e:
            raise ValueError(f"{expr}: {e.read().decode(errors='replace')}") from None
        if out.get("status") != "success":
            raise ValueError(f"{expr}: {out}")
        result = out["data"]["result"]
        if out["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float,
                    step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
        url = f"{self.prom_url}/api/v1/query_range?{urllib.parse.urlencode(params)}"
        out = http_json(url)
        if out.get("status") != "success":
            raise ValueError(f"{expr}: {out}")
        return list(out["data"]["result"])

    def rules(self) -> list[dict[str, Any]]:
        return list(http_json(f"{self.prom_url}/api/v1/rules")["data"]["groups"])

    def targets(self) -> list[dict[str, Any]]:
        return list(http_json(f"{self.prom_url}/api/v1/targets")["data"]["activeTargets"])

    # -- the extender ----------------------------------------------------------------------

    def drive_extender(self, bind: bool = False) -> int:
        """Filter and prioritize (and optionally bind) every pending example pod, as
        kube-scheduler would; returns the number of requests sent."""
        nodes = [n["metadata"]["name"] for n in _items(EXAMPLES / "nodes.yaml")]
        sent = 0
        for pod in _items(EXAMPLES / "pods.yaml"):
            spec = pod.get("spec", {})
            if (spec.get("nodeName") or spec.get("schedulerName") != "gpupack"
                    or pod["metadata"]["name"] in self.bound):
                continue
            args = {"Pod": pod, "Nodes": None, "NodeNames": nodes}
            result = http_json(f"{self.extender_url}/filter", args)
            passed = result.get("NodeNames") or []
            http_json(f"{self.extender_url}/prioritize", {**args, "NodeNames": passed or nodes})
            sent += 2
            if bind and passed:
                meta = pod["metadata"]
                result = http_json(f"{self.extender_url}/bind", {
                    "PodName": meta["name"], "PodNamespace": meta.get("namespace", "default"),
                    "PodUID": meta.get("uid", ""), "Node": passed[0]})
                if result.get("Error"):
                    raise RuntimeError(f"bind {meta['name']} -> {passed[0]}: {result['Error']}")
                self.bound.add(meta["name"])
                return sent + 1  # one bind per call: the pictures show a gradual change
        return sent

    def drive_webhook(self) -> int:
        """AdmissionReviews for sample pods (ASR and TTS by class, an LLM pod, a CPU pod),
        as the API server sends them; returns the number sent."""
        assert self.ca_file is not None
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.check_hostname = False  # the TLS tests check the name; here only the CA
        samples = [
            {"gpupack.io/class": "asr", "gpupack.io/gpu-memory": "8Gi"},
            {"gpupack.io/class": "tts"},
            {"gpupack.io/class": "whole"},
            {},
        ]
        for i, ann in enumerate(samples):
            limits = {"nvidia.com/gpu": "2"} if ann.get("gpupack.io/class") == "whole" else {}
            pod = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": f"sample-{i}", "namespace": "speech",
                                "annotations": ann},
                   "spec": {"containers": [{"name": "main", "image": "img",
                                            "resources": {"limits": limits}}]}}
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {"uid": f"00000000-0000-4000-8000-{i:012d}",
                                  "kind": {"group": "", "version": "v1", "kind": "Pod"},
                                  "resource": {"group": "", "version": "v1",
                                               "resource": "pods"},
                                  "namespace": "speech", "operation": "CREATE",
                                  "object": pod, "userInfo": {"username": "test"}}}
            req = urllib.request.Request(f"{self.webhook_url}/mutate",
                                         data=json.dumps(review).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                json.loads(resp.read())
        return len(samples)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for path in self.logs:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


def _items(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    return list(doc.get("items", [])) if isinstance(doc, dict) else list(doc)


def prometheus_config(extender_port: int, agent_port: int, webhook_port: int, ca_file: Path,
                      rule_file: Path | None) -> str:
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "scrape_configs": [
            # The namespace label is the Prometheus Operator's (from the target's pod).
            {"job_name": EXTENDER_JOB,
             "static_configs": [{"targets": [f"127.0.0.1:{extender_port}"],
                                 "labels": {"namespace": "gpupack"}}]},
            {"job_name": AGENT_JOB,
             "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"],
                                 "labels": {"node": AGENT_NODE}}]},
            {"job_name": WEBHOOK_JOB, "scheme": "https",
             "tls_config": {"ca_file": str(ca_file), "server_name": WEBHOOK_DNS},
             "static_configs": [{"targets": [f"127.0.0.1:{webhook_port}"]}]},
        ],
    }
    if rule_file is not None:
        cfg["rule_files"] = [str(rule_file)]
    return yaml.safe_dump(cfg, sort_keys=False)


def dra_nodes_file(workdir: Path) -> Path:
    """The example nodes plus one node whose GPUs are ResourceSlices (two H100s of the
    NVIDIA DRA driver, one of them held by an allocated claim): the extender's DRA
    figures have data."""
    from packing.dra import nvidia

    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "dra-0", "labels": {"kubernetes.io/hostname": "dra-0"}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}}}
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "held", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": nvidia.GPU_CLASS}}]}},
             "status": {"allocation": {"devices": {"results": [{
                 "request": "gpu", "driver": nvidia.DRIVER, "pool": "dra-0",
                 "device": "gpu-0"}]}}}}
    objs = [*_items(EXAMPLES / "nodes.yaml"), node,
            *nvidia.node_slices("dra-0", [nvidia.GpuSpec(g, "H100-80GB") for g in range(2)]),
            *nvidia.device_classes(), claim]
    path = workdir / "nodes-with-dra.yaml"
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    return path


def start(workdir: Path, rule_groups: list[dict[str, Any]] | None = None) -> Stack:
    """Start the extender, the fake-NVML agent and Prometheus; returns once all answer."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise FileNotFoundError("prometheus")
    gpupack = shutil.which("gpupack")
    workdir.mkdir(parents=True, exist_ok=True)
    stack = Stack(workdir)
    ext_port, agent_port, prom_port = free_port(), free_port(), free_port()
    hook_port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def spawn(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        log = workdir / f"{name}.log"
        stack.logs.append(log)
        with log.open("wb") as fh:
            p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                 cwd=REPO)
        stack.procs.append(p)
        return p

    try:
        serve_cmd = ([gpupack] if gpupack else [sys.executable, "-m", "gpupack"]) + [
            "serve", "--host", "127.0.0.1", "--port", str(ext_port),
            "--nodes", str(dra_nodes_file(workdir)), "--pods", str(EXAMPLES / "pods.yaml"),
            "--time-limit", "1", "--log-level", "WARNING"]
        ext = spawn("extender", serve_cmd)
        agent = spawn("agent", [sys.executable, str(Path(__file__).with_name("fake_agent.py")),
                                str(agent_port)])
        tls = workdir / "tls"
        made = subprocess.run(["bash", str(REPO / "manifests" / "tls" / "make-self-signed.sh"),
                               str(tls)], capture_output=True, text=True, timeout=60)
        if made.returncode != 0:
            raise RuntimeError(f"make-self-signed.sh: {made.stderr}")
        stack.ca_file = tls / "ca.crt"
        hook = spawn("webhook", ([gpupack] if gpupack else [sys.executable, "-m", "gpupack"]) + [
            "webhook", "--host", "127.0.0.1", "--port", str(hook_port),
            "--tls-cert", str(tls / "tls.crt"), "--tls-key", str(tls / "tls.key"),
            "--nodes", str(EXAMPLES / "nodes.yaml"), "--pods", str(EXAMPLES / "pods.yaml"),
            "--log-level", "warning"])
        rule_file = None
        if rule_groups is not None:
            rule_file = workdir / "rules.yaml"
            rule_file.write_text(yaml.safe_dump({"groups": rule_groups}, sort_keys=False))
        config = workdir / "prometheus.yml"
        config.write_text(prometheus_config(ext_port, agent_port, hook_port, stack.ca_file,
                                            rule_file))
        prom = spawn("prometheus", [
            prometheus, f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
            "--storage.tsdb.retention.time=1h", "--log.level=warn"])
        stack.extender_url = f"http://127.0.0.1:{ext_port}"
        stack.agent_url = f"http://127.0.0.1:{agent_port}"
        stack.prom_url = f"http://127.0.0.1:{prom_port}"
        stack.webhook_url = f"https://127.0.0.1:{hook_port}"
        wait_http(f"{stack.prom_url}/-/ready", 30, prom)
        wait_http(f"{stack.agent_url}/metrics", 30, agent)
        wait_http(f"{stack.extender_url}/readyz", 60, ext)
        ctx = ssl.create_default_context(cafile=str(stack.ca_file))
        ctx.check_hostname = False
        wait_http(f"{stack.webhook_url}/healthz", 30, hook, ctx)
    except BaseException:
        stack.stop()
        raise
    return stack
