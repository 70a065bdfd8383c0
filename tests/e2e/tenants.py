"""What tests/e2e/test_e2e_tenants.py and bench/hostile.py --tenant share: a tenant's
attacks on the real control plane (issue 35), as functions of a running stack.

Reviews posted straight to the webhook (with the client certificate of the PKI's name,
or none), a victim's server-side dry run, the issue's pool, the reservation records of a
namespace, pods of a group named by gpupack's labels, the LeaderWorkerSet CRD.
"""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.request
import uuid
from typing import Any

import pytest
from cluster import GPU, NodeSpec, create_nodes, h100_mig, l40s_shared, pod
from controlplane import NAMESPACE, Stack
from kubernetes.client.rest import ApiException

MIG = "nvidia.com/mig-3g.40gb"
SHARED = "nvidia.com/gpu.shared"
CLIQUE = "nvidia.com/gpu.clique"


def webhook_port(stack: Stack) -> int:
    argv = stack.state()["components"]["webhook"]["argv"]
    return int(argv[argv.index("--port") + 1])


def client_context(stack: Stack, client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(stack.dir / "webhook-tls" / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service; we call 127.0.0.1
    if client is not None:
        pki = stack.dir / "pki"
        ctx.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    return ctx


def post_review(stack: Stack, body: dict[str, Any], client: str | None
                ) -> tuple[int, dict[str, Any]]:
    """POST a review straight to the webhook's port, with the client certificate
    ``pki/<client>.crt`` (None: none); (status, JSON answer)."""
    conn = http.client.HTTPSConnection("127.0.0.1", webhook_port(stack), timeout=15,
                                       context=client_context(stack, client))
    try:
        conn.request("POST", "/mutate", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def review(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """An AdmissionReview as the API server would send it for creating ``obj``."""
    obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()),
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                        "name": obj["metadata"]["name"], "namespace": namespace,
                        "operation": "CREATE",
                        "userInfo": {"username": f"system:serviceaccount:{namespace}:default"},
                        "object": obj, "oldObject": None, "dryRun": False,
                        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def forge(stack: Stack, pool: str, namespace: str, n: int, client: str | None) -> list[int]:
    """``n`` forged reviews for 30Gi pods of ``namespace`` in ``pool``: their statuses."""
    out = []
    for i in range(n):
        body = review(pod(f"forged-{i}", annotations={"gpupack.io/gpu-memory": "30Gi"},
                           pool=pool), namespace)
        status, answer = post_review(stack, body, client)
        out.append(status)
        if status == 200:
            assert answer["response"]["allowed"] is True, answer
    return out


def decision(core: Any, ns: str, pool: str) -> tuple[str, str]:
    """The victim's server-side dry run through the real API server and webhook."""
    probe = pod("victim", annotations={"gpupack.io/gpu-memory": "30Gi"}, pool=pool)
    out = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod(ns, probe, dry_run="All"))
    (resource,) = out["spec"]["containers"][0]["resources"]["limits"]
    reason = json.loads(out["metadata"]["annotations"]["gpupack.io/decision"])["reason"]
    return resource, reason


RECORDS = "app.kubernetes.io/managed-by=gpupack,app.kubernetes.io/component=group-reservation"


def records(core: Any, ns: str) -> dict[str, dict[str, Any]]:
    """The reservation records of groups of namespace ``ns``: group key -> record."""
    out = {}
    for cm in core.list_namespaced_config_map(NAMESPACE, label_selector=RECORDS).items:
        rec = json.loads((cm.data or {}).get("reservation", "{}"))
        if str(rec.get("g", "")).startswith(ns + "/"):
            out[rec["g"]] = rec
    return out


def labelled(name: str, size: int, gpus: int, pool: str, worker: int = 0) -> dict[str, Any]:
    """A pod of a group named only by gpupack's labels (no LeaderWorkerSet object)."""
    return pod(name if worker == 0 else f"{name}-{worker}", pool=pool,
               limits={GPU: str(gpus)},
               annotations={"gpupack.io/group": name, "gpupack.io/group-size": str(size),
                            "gpupack.io/class": "whole"})


LWS_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "leaderworkersets.leaderworkerset.x-k8s.io"},
    "spec": {"group": "leaderworkerset.x-k8s.io", "scope": "Namespaced",
             "names": {"plural": "leaderworkersets", "singular": "leaderworkerset",
                       "kind": "LeaderWorkerSet", "listKind": "LeaderWorkerSetList"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True}}}]}}


def admitted(core: Any, ns: str, body: dict[str, Any]) -> bool:
    """Whether a dry-run create of ``body`` passes admission (the webhook refuses a share
    no time-sliced GPU of its view holds: its view has not seen a new node yet)."""
    try:
        core.create_namespaced_pod(ns, body, dry_run="All")
    except ApiException as e:
        if e.status in (400, 403):
            return False
        raise
    return True


def ready(stack: Stack, component: str) -> bool:
    url = stack.state()["components"][component]["url"] + "/readyz"
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def refused(call: Any, needle: str = "") -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 403, (err.value.status, err.value.body)
    body = str(err.value.body)
    assert needle in body, body
    return body


def issue_pool(core: Any, name: str) -> list[str]:
    """The issue's pool ``name``: 8 free 3g.40gb slices and 12 time-sliced L40S shares;
    the nodes made."""
    specs: list[NodeSpec] = [l40s_shared(f"{name}-l40s", name, gpus=3),
                             h100_mig(f"{name}-mig-b", name, {"3g.40gb": 4}),
                             h100_mig(f"{name}-mig-a", name, {"3g.40gb": 4})]
    return create_nodes(core, specs)
