"""`gpupack simulate --from-cluster` on the real API server (issue 36, item 2): it reads
the cluster's Nodes and Pods with an identity allowed nothing but ``get``/``list`` on
them, makes only ``list`` calls (the API server's audit log), and says the same as the
file-based replay of the same objects."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from cluster import (
    GPU,
    POOL,
    SHARED,
    create_nodes,
    create_pods,
    h100_mig,
    h100_whole,
    l40s_shared,
    pod,
)
from conftest import Space
from controlplane import NAMESPACE, Stack, apply_objects, service_account_token, write_kubeconfig

READER = "gpupack-e2e-simulate-reader"


def reader_kubeconfig(stack: Stack, admin: Any, path: Path) -> None:
    """A kubeconfig for a ServiceAccount of gpupack's namespace (so the audit log keeps
    its requests) whose only grant is get/list on nodes and pods."""
    apply_objects(admin, [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": READER, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": READER},
         "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"],
                    "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": READER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": READER},
         "subjects": [{"kind": "ServiceAccount", "name": READER, "namespace": NAMESPACE}]},
    ])
    cluster = yaml.safe_load(stack.kubeconfig.read_text())["clusters"][0]["cluster"]
    write_kubeconfig(path, cluster["server"], Path(cluster["certificate-authority"]),
                     token=service_account_token(admin, NAMESPACE, READER))


def simulate(*args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "gpupack", "simulate", "--format", "json",
                        *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def comparable(doc: dict[str, Any]) -> list[dict[str, Any]]:
    keep = ("policy", "gpus_needed", "nodes_needed", "pods_waiting_peak",
            "groups_waiting_peak", "wait_p99_s", "overcommitted", "needed_by_pool",
            "waited", "fragmentation")
    return [{k: r[k] for k in keep} for r in doc["results"]]


def test_from_cluster_reads_only_and_matches_the_files(stack: Stack, admin: Any, core: Any,
                                                       space: Space, tmp_path: Path) -> None:
    pool = space.name
    space.nodes += create_nodes(core, [
        h100_whole(f"{pool}-h100-0", pool), h100_whole(f"{pool}-h100-1", pool),
        h100_mig(f"{pool}-mig-0", pool, {"1g.10gb": 14, "3g.40gb": 4}),
        l40s_shared(f"{pool}-l40s-0", pool)])
    ns = space.namespace()
    made = create_pods(core, ns, [
        pod("llm-0", limits={GPU: "2"}, pool=pool),
        pod("llm-1", limits={GPU: "8"}, pool=pool),
        pod("asr-0", limits={"nvidia.com/mig-1g.10gb": "1"}, pool=pool),
        pod("emb-0", limits={SHARED: "1"}, pool=pool),
        pod("sized-0", annotations={"gpupack.io/gpu-memory": "8Gi"}, pool=pool),
        pod("rocm-0", limits={"amd.com/gpu": "1"}, pool=pool),
    ])
    assert len(made) == 6
    kubeconfig = tmp_path / "reader.kubeconfig"
    reader_kubeconfig(stack, admin, kubeconfig)
    live = simulate("--from-cluster", "--kubeconfig", str(kubeconfig), "--namespace", ns,
                    "--node-selector", f"{POOL}={pool}", "--out", str(tmp_path / "live"))
    assert live["kind"] == "cluster" and live["replayed"] == 5
    assert live["cluster"]["nodes"] == 4
    assert [u.split(":")[0] for u in live["unmodelled"]] == [f"Pod {ns}/rocm-0"]
    assert {r["policy"] for r in live["results"]} == {"kube-scheduler", "gpupack"}
    for r in live["results"]:
        assert r["overcommitted"] == 0 and r["pods_waiting_peak"] == 0

    # Only lists of nodes and pods, nothing written, by the reader's identity.
    events = [json.loads(line) for line in
              (stack.dir / "logs" / "audit.log").read_text().splitlines() if line.strip()]
    mine = [e for e in events if e.get("user", {}).get("username")
            == f"system:serviceaccount:{NAMESPACE}:{READER}"]
    assert mine, "the reader's requests are not in the audit log"
    assert {(e["verb"], e["objectRef"]["resource"]) for e in mine} == {
        ("list", "nodes"), ("list", "pods")}
    assert all(e["responseStatus"]["code"] == 200 for e in mine)

    # The same objects from files (as kubectl get -o yaml writes them) say the same.
    nodes = json.loads(core.list_node(label_selector=f"{POOL}={pool}",
                                      _preload_content=False).data)
    pods = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({**nodes, "kind": "NodeList"}))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({**pods, "kind": "PodList"}))
    files = simulate("--nodes", str(tmp_path / "nodes.yaml"), "--pods",
                     str(tmp_path / "pods.yaml"), "--out", str(tmp_path / "files"))
    assert comparable(files) == comparable(live)
    assert files["unmodelled"] == live["unmodelled"]
