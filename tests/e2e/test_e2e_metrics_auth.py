"""/metrics behind delegated authentication against the real API server: the extender's
``--metrics-port`` and the webhook's HTTPS ``/metrics`` send each scrape's bearer token to
a TokenReview and its identity to a SubjectAccessReview (non-resource URL ``/metrics``,
verb ``get``), with their own ServiceAccount tokens and the chart's
``system:auth-delegator`` bindings.

A ServiceAccount ``prometheus`` in ``gpupack`` is granted ``get`` on ``/metrics`` (the
ClusterRole a Prometheus needs; kube-prometheus-stack's has it) and scrapes with a
TokenRequest token: 200. No token: 401. A forged token: 401. The ``default`` account of
the test's namespace (no such grant): 403. The probes' paths need no token.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import wait_for
from conftest import Space
from controlplane import NAMESPACE, Stack, metrics_reader, service_account_token
from kubernetes import client

SCRAPER = "prometheus"
READER_ROLE = "gpupack-e2e-metrics-reader"


def _port_of(stack: Stack, component: str, flag: str) -> int:
    argv = stack.state()["components"][component]["argv"]
    return int(argv[argv.index(flag) + 1])


def get(port: int, path: str, token: str | None = None,
        context: ssl.SSLContext | None = None) -> tuple[int, str]:
    conn: http.client.HTTPConnection
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=15, context=context)
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _allowed(admin: Any, user: str) -> bool:
    """The API server's own answer: RBAC has picked up the binding (its informers lag a
    moment), so the extender's first review sees it too."""
    review = client.AuthorizationV1Api(admin).create_subject_access_review({
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts",
                                          f"system:serviceaccounts:{NAMESPACE}"],
                 "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
    return bool(review.status.allowed)


@pytest.fixture(scope="module")
def scraper_token(stack: Stack, admin: Any) -> Iterator[str]:
    """A token of ``gpupack/prometheus``, whose ClusterRole allows get on /metrics."""
    with metrics_reader(admin, SCRAPER, READER_ROLE) as token:
        user = f"system:serviceaccount:{NAMESPACE}:{SCRAPER}"
        wait_for(lambda: _allowed(admin, user), 30, f"RBAC to allow {user} get /metrics")
        yield token


def test_extender_metrics_port_needs_an_allowed_token(stack: Stack, admin: Any,
                                                      space: Space, scraper_token: str
                                                      ) -> None:
    port = _port_of(stack, "extender", "--metrics-port")
    # The kubelet's probes carry no token.
    assert get(port, "/healthz")[0] == 200
    assert get(port, "/readyz")[0] == 200
    status, body = get(port, "/metrics", scraper_token)
    assert status == 200, body
    assert "\ngpupack_leader " in body, body[:2000]
    status, body = get(port, "/metrics")
    assert status == 401 and "Authorization: Bearer" in json.loads(body)["error"], body
    status, body = get(port, "/metrics", "not-a-token")
    assert status == 401, body
    assert "gpupack_" not in body
    other_ns = space.namespace()
    other = service_account_token(admin, other_ns, "default")
    status, body = get(port, "/metrics", other)
    assert status == 403, body
    assert json.loads(body)["error"] == (
        f'forbidden: User "system:serviceaccount:{other_ns}:default" cannot get path '
        '"/metrics"')


def test_webhook_metrics_need_an_allowed_token(stack: Stack, scraper_token: str) -> None:
    port = _port_of(stack, "webhook", "--port")
    ctx = ssl.create_default_context(cafile=str(stack.dir / "webhook-tls" / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service; we call 127.0.0.1
    assert get(port, "/healthz", context=ctx)[0] == 200
    status, body = get(port, "/metrics", scraper_token, context=ctx)
    assert status == 200 and "gpupack_webhook_" in body, body
    assert get(port, "/metrics", context=ctx)[0] == 401


def test_extender_made_both_reviews(stack: Stack, scraper_token: str) -> None:
    """What the audit log saw the extender's account (the scheduler pod's) create: both
    reviews, allowed by system:auth-delegator (none refused)."""
    port = _port_of(stack, "extender", "--metrics-port")
    get(port, "/metrics", scraper_token)  # reviewed already, or now
    account = f"system:serviceaccount:{NAMESPACE}:" + stack.state()["service_accounts"][
        "extender"]

    def reviews() -> dict[str, int] | None:
        seen: dict[str, int] = {}
        for line in (stack.dir / "logs" / "audit.log").read_text().splitlines():
            e = json.loads(line)
            ref = e.get("objectRef") or {}
            if (e.get("user", {}).get("username") == account and e.get("verb") == "create"
                    and ref.get("resource") in ("tokenreviews", "subjectaccessreviews")):
                seen[ref["resource"]] = e.get("responseStatus", {}).get("code", 0)
        return seen if len(seen) == 2 else None

    time.sleep(0.5)  # the audit log is written as requests finish
    seen = wait_for(reviews, 30, "the extender's reviews in the audit log")
    assert seen == {"tokenreviews": 201, "subjectaccessreviews": 201}
