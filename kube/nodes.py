"""Node writes and node-scoped reads for the node agent, over the ``kubernetes`` client.

Kept tiny on purpose: the agent's logic works on plain values and calls these through
injected functions, so tests never need an API server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def load_core_api(kubeconfig: str | None = None) -> Any:
    """A ``CoreV1Api``: from ``kubeconfig`` when given, else in-cluster config (the
    DaemonSet's service account), else the default kubeconfig for a developer shell."""
    from kubernetes import client, config

    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    return client.CoreV1Api()


PATCH_TIMEOUT_S = 10.0
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


def patch_node_annotations(api: Any, node: str, annotations: Mapping[str, str | None]) -> None:
    """Set (or, with None, remove) annotations on ``node`` with a JSON merge patch.

    A merge patch touches only the named keys, so other writers' annotations survive and
    no resourceVersion read-modify-write loop is needed.
    """
    body = {"metadata": {"annotations": dict(annotations)}}
    # Unless told, the client sends a dict body as a strategic merge patch; say merge
    # patch explicitly so the request means the same on every API server and in fakes.
    # With a timeout: an API server that accepts the connection and never answers must
    # not stop the agent's loop (the patch is retried on a later tick).
    api.patch_node(node, body, _content_type="application/merge-patch+json",
                   _request_timeout=PATCH_TIMEOUT_S)


def list_node_pod_keys(api: Any, node: str) -> dict[str, str]:
    """Pod UID -> ``namespace/name`` for pods bound to ``node`` (field selector, so the
    API server filters). The cgroup of a GPU process names its pod only by UID."""
    pods = api.list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={node}", _request_timeout=10
    )
    out: dict[str, str] = {}
    for p in pods.items:
        key = f"{p.metadata.namespace}/{p.metadata.name}"
        out[p.metadata.uid] = key
        # A static pod's cgroup carries the kubelet's config hash, not the API mirror
        # pod's UID; the mirror pod names the hash in this annotation.
        mirror = (p.metadata.annotations or {}).get(MIRROR_ANNOTATION)
        if mirror:
            out[mirror] = key
    return out
