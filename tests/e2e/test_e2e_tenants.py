"""Tenants cannot steer other tenants, on the real control plane (issue 35).

Item 1, the webhook. The stack's API server presents a client certificate to the webhook
(its ``--admission-control-config-file``), and the webhook runs with the chart's
``webhook.clientAuth``: a review posted straight to the webhook's port without that
certificate is refused. And even a caller holding it (a cluster where the webhook cannot
verify its caller) cannot take another namespace's slices: 24 forged reviews for pods of
namespace ``<test>-evil`` leave a victim's server-side dry run in ``<test>`` exactly as
it was; the same reviews naming the victim's own namespace do change it (the control:
the forged claims are live, and count where a burst of one workload lives).
"""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from typing import Any

from cluster import create_nodes, h100_mig, l40s_shared, pod, wait_for_webhook
from conftest import Space
from controlplane import Stack

MIG = "nvidia.com/mig-3g.40gb"
SHARED = "nvidia.com/gpu.shared"


def _webhook_port(stack: Stack) -> int:
    argv = stack.state()["components"]["webhook"]["argv"]
    return int(argv[argv.index("--port") + 1])


def _context(stack: Stack, client: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(stack.dir / "webhook-tls" / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service; we call 127.0.0.1
    if client is not None:
        pki = stack.dir / "pki"
        ctx.load_cert_chain(str(pki / f"{client}.crt"), str(pki / f"{client}.key"))
    return ctx


def _post(stack: Stack, body: dict[str, Any], client: str | None) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPSConnection("127.0.0.1", _webhook_port(stack), timeout=15,
                                       context=_context(stack, client))
    try:
        conn.request("POST", "/mutate", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _review(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
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


def _forge(stack: Stack, pool: str, namespace: str, n: int, client: str | None) -> list[int]:
    out = []
    for i in range(n):
        body = _review(pod(f"forged-{i}", annotations={"gpupack.io/gpu-memory": "30Gi"},
                           pool=pool), namespace)
        status, answer = _post(stack, body, client)
        out.append(status)
        if status == 200:
            assert answer["response"]["allowed"] is True, answer
    return out


def _decision(core: Any, ns: str, pool: str) -> tuple[str, str]:
    """The victim's server-side dry run through the real API server and webhook."""
    probe = pod("victim", annotations={"gpupack.io/gpu-memory": "30Gi"}, pool=pool)
    out = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod(ns, probe, dry_run="All"))
    (resource,) = out["spec"]["containers"][0]["resources"]["limits"]
    reason = json.loads(out["metadata"]["annotations"]["gpupack.io/decision"])["reason"]
    return resource, reason


def _pool(core: Any, space: Space) -> str:
    """The issue's pool: 8 free 3g.40gb slices and 12 time-sliced L40S shares."""
    space.nodes += create_nodes(core, [
        l40s_shared(f"{space.name}-l40s", space.name, gpus=3),
        h100_mig(f"{space.name}-mig-b", space.name, {"3g.40gb": 4}),
        h100_mig(f"{space.name}-mig-a", space.name, {"3g.40gb": 4}),
    ])
    return space.name


def test_only_the_api_servers_certificate_may_post_reviews(
        stack: Stack, core: Any, space: Space) -> None:
    ns = space.namespace()
    pool = _pool(core, space)
    wait_for_webhook(core, ns, pod("probe", annotations={"gpupack.io/gpu-memory": "30Gi"},
                                   pool=pool), MIG)
    body = _review(pod("forged", annotations={"gpupack.io/gpu-memory": "30Gi"}, pool=pool),
                   f"{ns}-evil")
    status, answer = _post(stack, body, None)
    assert status == 401 and "client certificate is required" in answer["error"], answer
    # A certificate of the cluster's own CA, but not the API server's name.
    status, answer = _post(stack, body, "admin")
    assert status == 403 and "e2e-admin" in answer["error"], answer
    # What the API server itself sends is answered.
    status, answer = _post(stack, body, "webhook-client")
    assert status == 200 and answer["response"]["allowed"] is True
    # And pods created through the API server are sized as ever.
    assert _decision(core, ns, pool)[0] == MIG


def test_forged_reviews_of_another_namespace_leave_a_victims_decision(
        stack: Stack, core: Any, space: Space, capsys: Any) -> None:
    ns = space.namespace()
    pool = _pool(core, space)
    wait_for_webhook(core, ns, pod("probe", annotations={"gpupack.io/gpu-memory": "30Gi"},
                                   pool=pool), MIG)
    before = _decision(core, ns, pool)
    assert before[0] == MIG
    # Without the certificate nothing is even read.
    assert set(_forge(stack, pool, f"{ns}-evil", 24, None)) == {401}
    assert _decision(core, ns, pool) == before
    # With it (as if the webhook could not verify its caller): 24 forged claims, as many
    # as the pool has slices and shares, all for the other namespace.
    assert set(_forge(stack, pool, f"{ns}-evil", 24, "webhook-client")) == {200}
    after = _decision(core, ns, pool)
    # The control: 8 such reviews naming the victim's namespace are counted there.
    assert set(_forge(stack, pool, ns, 8, "webhook-client")) == {200}
    own = _decision(core, ns, pool)
    with capsys.disabled():
        print(f"\n  e2e forged reviews: victim before {before[0]}, after 24 forged for "
              f"another namespace {after[0]}, after 8 naming its own {own[0]}")
    assert after == before
    assert own[0] == SHARED, own
