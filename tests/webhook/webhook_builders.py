"""Builders for webhook tests: Node and Pod objects as the API server sends them."""

from __future__ import annotations

from typing import Any

from builders_nodes import PRODUCTS, gpu_node

from kube.snapshot import build_snapshot
from packing.catalog import get_model
from packing.model import Snapshot


def node(
    name: str,
    model: str = "H100-80GB",
    gpus: int = 8,
    mode: str = "mig",
    replicas: int = 4,
    mig: dict[str, int] | None = None,
    labels: dict[str, str] | None = None,
    product: str | None = None,
) -> dict[str, Any]:
    """A GPU node (:func:`builders_nodes.gpu_node`): ``mode`` whole | mig (mixed
    strategy) | shared (time-slicing) | mps (the device plugin's sharing.mps, renamed to
    nvidia.com/gpu.shared)."""
    if mode not in ("whole", "mig", "shared", "mps"):
        mode = "mig"
    return gpu_node(
        name, product or PRODUCTS[model], gpus=gpus,
        whole=gpus if mode == "whole" else 0,
        mig=mig if mode == "mig" else None,
        replicas=replicas if mode in ("shared", "mps") else 0,
        sharing="mps" if mode == "mps" else "time-slicing",
        cpu="128", memory="1Ti", gpu_memory_mib=get_model(model).memory_mib,
        mig_strategy="mixed" if mode == "mig" else None, labels=labels)


OPT_IN = {"gpupack.io/mig-reconfigure": "true"}


def cluster(*nodes: dict[str, Any], pods: list[dict[str, Any]] | None = None,
            mig_actuator: bool = False) -> Snapshot:
    """The snapshot of these nodes; layouts are what the nodes report unless a node opts
    in (``OPT_IN``) and ``mig_actuator`` is on."""
    return build_snapshot(list(nodes), pods or [], mig_actuator=mig_actuator).snapshot


def opted_in(n: dict[str, Any]) -> dict[str, Any]:
    """The node with the label that opts it in to MIG re-partitioning."""
    n["metadata"]["labels"].update(OPT_IN)
    return n


def dynamic(*nodes: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> Snapshot:
    """A cluster whose MIG layouts are made on demand: every node opts in and the MIG
    actuator is on (a MIG node without ``mig`` then offers every profile)."""
    return cluster(*(opted_in(n) for n in nodes), pods=pods, mig_actuator=True)


def pod(
    name: str = "p",
    annotations: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
    namespace: str = "speech",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    body: dict[str, Any] = {
        "containers": containers if containers is not None else [{"name": "main", "image": "x"}],
    }
    body.update(spec or {})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": body}


def review(obj: Any, uid: str = "uid-1", operation: str = "CREATE", kind: str = "Pod",
           namespace: str = "speech") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "name": "",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }
