"""The HTTP contract against a real ``gpupack serve`` (gunicorn) process on loopback,
with request bodies shaped exactly as kube-scheduler sends them."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import yaml
from sched_builders import L40S, mig_pod, node, shared_pod, whole_pod
from serve_process import free_port, serving

NODES = [
    node("gpu-a", mig={"1g.10gb": 7}),
    node("gpu-l40s", product=L40S, gpus=2, shared_replicas=4),
    node("gpu-whole", gpus=4, reconfigurable=False),
]
PODS = [
    mig_pod("asr-0", namespace="speech", uid="6f1c2a9e-0000-4000-8000-000000000001"),
    shared_pod("tts-0", namespace="speech", uid="6f1c2a9e-0000-4000-8000-000000000002"),
    *[whole_pod(f"llm-{i}", 1, namespace="llm", uid=f"llm-uid-{i}") for i in range(12)],
    whole_pod("victim-0", 1, namespace="batch", uid="victim-uid-0", node="gpu-whole",
              priority=0, annotations={"gpupack.io/gpus": "0"}),
]


class Client:
    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self.metrics_port = 0

    def call(self, method: str, path: str, body: bytes | str | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            data = body.encode() if isinstance(body, str) else body
            conn.request(method, path, body=data,
                         headers={"Content-Type": "application/json", **(headers or {})})
            resp = conn.getresponse()
            raw = resp.read()
            try:
                return resp.status, json.loads(raw)
            except ValueError:
                return resp.status, raw.decode()
        finally:
            conn.close()

    def post(self, path: str, obj: Any) -> tuple[int, Any]:
        return self.call("POST", path, json.dumps(obj))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    d = tmp_path_factory.mktemp("serve")
    (d / "nodes.yaml").write_text(yaml.safe_dump({"kind": "NodeList", "items": NODES}))
    (d / "pods.yaml").write_text(yaml.safe_dump({"kind": "PodList", "items": PODS}))
    port, metrics_port = free_port(), free_port()
    client = Client(port)
    client.metrics_port = metrics_port
    with serving(port, ["--metrics-port", str(metrics_port), "--metrics-host", "0.0.0.0",
                        "--nodes", str(d / "nodes.yaml"), "--pods", str(d / "pods.yaml"),
                        "--max-body", "65536", "--time-limit", "0.5", "--debounce", "0.05",
                        "--log-level", "WARNING"]):
        yield client


# Exactly what kube-scheduler v1.30 sends with nodeCacheCapable: true (Go field names;
# a full v1.Pod inside, lowercase as ordinary pod JSON).
FILTER_CACHE_CAPABLE = """{"Pod":{"metadata":{"name":"asr-0","namespace":"speech",
"uid":"6f1c2a9e-0000-4000-8000-000000000001","creationTimestamp":"2026-01-01T00:00:00Z"},
"spec":{"containers":[{"name":"c","image":"img","resources":{"limits":
{"nvidia.com/mig-1g.10gb":"1"},"requests":{"nvidia.com/mig-1g.10gb":"1"}}}],
"restartPolicy":"Always","schedulerName":"gpupack","priority":0},
"status":{"phase":"Pending"}},"Nodes":null,"NodeNames":["gpu-a","gpu-l40s","gpu-whole"]}"""


def test_filter_node_cache_capable(server: Client) -> None:
    status, out = server.call("POST", "/filter", FILTER_CACHE_CAPABLE)
    assert status == 200
    assert out["NodeNames"] == ["gpu-a"]
    assert out["Nodes"] is None
    assert out["Error"] == ""
    assert set(out["FailedAndUnresolvableNodes"]) == {"gpu-l40s", "gpu-whole"}
    assert "no GPU of a usable kind" in out["FailedAndUnresolvableNodes"]["gpu-l40s"]


def test_filter_full_nodes_and_lowercase_keys(server: Client) -> None:
    body = {"pod": shared_pod("tts-0", namespace="speech"),
            "nodes": {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": NODES},
            "nodenames": None}
    status, out = server.post("/filter", body)
    assert status == 200
    assert out["NodeNames"] is None
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-l40s"]
    assert out["Nodes"]["items"][0] == NODES[1]  # the scheduler's own objects, unchanged


def test_prioritize_returns_a_bare_host_priority_list(server: Client) -> None:
    body = json.loads(FILTER_CACHE_CAPABLE)
    body["NodeNames"] = ["gpu-a", "gpu-whole"]
    status, out = server.post("/prioritize", body)
    assert status == 200
    assert isinstance(out, list)
    assert [h["Host"] for h in out] == ["gpu-a", "gpu-whole"]
    assert all(set(h) == {"Host", "Score"} and 0 <= h["Score"] <= 10 for h in out)
    assert out[0]["Score"] == 10 and out[1]["Score"] == 0


def test_bind_then_rebind_is_refused(server: Client) -> None:
    args = {"PodName": "asr-0", "PodNamespace": "speech",
            "PodUID": "6f1c2a9e-0000-4000-8000-000000000001", "Node": "gpu-a"}
    assert server.post("/bind", args) == (200, {"Error": ""})
    status, out = server.post("/bind", args)
    assert status == 200 and "not pending" in out["Error"]
    status, out = server.post("/bind", {**args, "PodName": "tts-0",
                                        "PodUID": "wrong-uid", "Node": "gpu-l40s"})
    assert status == 200 and "UID" in out["Error"]


def test_a_pod_seen_only_in_a_filter_request_can_be_bound(server: Client) -> None:
    # Static mode (and informer lag in API mode): the pod is in no list gpupack read,
    # only in the filter request; its bind must not fail for that.
    pod = mig_pod("asr-new", namespace="speech", uid="asr-new-uid")
    status, out = server.post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-a"]})
    assert status == 200 and out["NodeNames"] == ["gpu-a"], out
    args = {"PodName": "asr-new", "PodNamespace": "speech", "PodUID": "asr-new-uid",
            "Node": "gpu-a"}
    assert server.post("/bind", args) == (200, {"Error": ""})
    status, out = server.post("/bind", args)
    assert status == 200 and "not pending" in out["Error"]
    # Another UID under the same name is not the pod the filter saw.
    status, out = server.post("/bind", {**args, "PodName": "never-filtered",
                                        "PodUID": "x"})
    assert status == 200 and "not in gpupack's cache" in out["Error"]


def test_concurrent_binds_never_double_book_a_gpu(server: Client) -> None:
    # gpu-whole has 4 GPUs, one held by victim-0: of 12 racing binds exactly 3 succeed.
    def bind(i: int) -> str:
        _, out = server.post("/bind", {"PodName": f"llm-{i}", "PodNamespace": "llm",
                                       "PodUID": f"llm-uid-{i}", "Node": "gpu-whole"})
        return str(out["Error"])

    with ThreadPoolExecutor(12) as pool:
        errors = list(pool.map(bind, range(12)))
    assert errors.count("") == 3
    assert all("does not fit" in e or "in use" in e for e in errors if e)
    _, text = server.call("GET", "/metrics")
    alloc = [line for line in text.splitlines()
             if line.startswith('gpupack_gpu_allocated{') and 'node="gpu-whole"' in line]
    assert len(alloc) == 4 and all(line.endswith(" 1.0") for line in alloc)


def test_preempt_meta_victims(server: Client) -> None:
    body = {"Pod": whole_pod("urgent", 1, namespace="llm", priority=1000),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": {
                "gpu-whole": {"Pods": [{"UID": "victim-uid-0"}], "NumPDBViolations": 0},
                "gpu-l40s": {"Pods": [], "NumPDBViolations": 0}}}
    status, out = server.post("/preempt", body)
    assert status == 200
    assert out == {"NodeNameToMetaVictims": {
        "gpu-whole": {"Pods": [{"UID": "victim-uid-0"}], "NumPDBViolations": 0}}}


@pytest.mark.parametrize(("path", "body", "needle"), [
    ("/filter", "{not json", "not valid JSON"),
    ("/filter", "", "empty body"),
    ("/filter", "[1, 2]", "expected a JSON object"),
    ("/filter", '{"Nodes": null, "NodeNames": ["gpu-a"]}', "ExtenderArgs.Pod: missing"),
    ("/filter", '{"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", '
                '"resources": {"limits": {"nvidia.com/gpu": "lots"}}}]}}, "NodeNames": []}',
     "nvidia.com/gpu"),
    ("/prioritize", '{"Pod": {"metadata": {"name": "x"}}, "NodeNames": "gpu-a"}', "NodeNames"),
    ("/bind", '{"PodName": "asr-0", "Node": "no-such-node"}', "unknown node 'no-such-node'"),
    ("/bind", '{"PodName": "asr-0"}', "ExtenderBindingArgs.Node: missing"),
    ("/preempt", '{"Pod": {"metadata": {"name": "x"}}, "NodeNameToMetaVictims": '
                 '{"gpu-a": {"Pods": [{"UID": 5}]}}}', "UID"),
    ("/filter", "[" * 100_000 + "]" * 100_000, "over the limit"),
    ("/filter", "[" * 30_000 + "]" * 30_000, "not valid JSON"),
    # Found by fuzzing: these answered 500, or held the cache lock for seconds.
    ("/filter", '{"Pod": {"metadata": {"name": "x"}, "spec": {"containers": [{"resources": '
                '{"limits": {"cpu": "1e1000000"}}}]}}, "NodeNames": ["gpu-a"]}', "out of range"),
    ("/filter", '{"Pod": {"metadata": {"name": "x", "annotations": {"gpupack.io/gpu-memory": '
                '"1e999999"}}, "spec": {}}, "NodeNames": ["gpu-a"]}', "out of range"),
    ("/filter", '{"Pod": {"metadata": {"name": "x", "annotations": {"gpupack.io/group": "g", '
                '"gpupack.io/group-size": "\u00b2"}}, "spec": {}}, "NodeNames": ["gpu-a"]}',
     "not a group size"),
    ("/filter", '{"Pod": {"metadata": {"name": "x"}, "spec": {}}, "Nodes": {"items": '
                '[{"metadata": {"name": "gpu-a"}, "x": ' + "[" * 300 + "]" * 300 + '}]}}',
     "nested too deeply"),
    ("/preempt", '{"Pod": {"metadata": {"name": "x"}}, "NodeNameToMetaVictims": '
                 '{"gpu-a": {"Pods": [], "NumPDBViolations": -1}}}', "is negative"),
])
def test_bad_bodies_get_400_naming_the_problem(server: Client, path: str, body: str,
                                               needle: str) -> None:
    status, out = server.call("POST", path, body)
    assert status == 400, out
    assert needle in out["error"]
    assert server.call("GET", "/healthz")[0] == 200  # and the server still serves


def test_unknown_path_and_method_are_json_errors(server: Client) -> None:
    assert server.call("GET", "/nope")[0] == 404
    status, out = server.call("GET", "/filter")
    assert status == 405 and "error" in out


def test_metrics_port_binds_metrics_host_while_verbs_stay_on_loopback(server: Client) -> None:
    # 127.0.0.2 is another loopback address: only a socket bound to 0.0.0.0 answers it,
    # so this tells --metrics-host 0.0.0.0 from the verbs' --host 127.0.0.1.
    status, text = Client(server.metrics_port, "127.0.0.2").call("GET", "/metrics")
    assert status == 200 and "gpupack_cache_nodes 3.0" in text
    with pytest.raises(OSError):
        Client(server.port, "127.0.0.2").call("GET", "/healthz")


def test_health_metrics_and_no_benchmark_route(server: Client) -> None:
    # The benchmarks' echo baseline is theirs (bench/echo_serve.py), not the product's.
    assert server.call("POST", "/echo", "12345")[0] == 404
    assert server.call("GET", "/healthz") == (200, {"ok": True})
    _, text = server.call("GET", "/metrics")
    for name in ("gpupack_extender_requests_total", "gpupack_extender_request_seconds_bucket",
                 "gpupack_plan_age_seconds", "gpupack_plan_solve_seconds", "gpupack_plan_status",
                 "gpupack_cache_nodes 3.0", "gpupack_cache_synced 1.0", "gpupack_whole_gpus_free",
                 "gpupack_whole_nodes_free", "gpupack_fragmentation_ratio",
                 "gpupack_pending_pods{", 'verb="filter",outcome="bad_request"',
                 'gpupack_scorer_replacements{reason="free_sizes"}'):
        assert name in text.replace('outcome="bad_request",verb="filter"',
                                    'verb="filter",outcome="bad_request"'), name
