"""The webhook's ``/metrics`` (on its HTTPS port) behind a metrics guard: refused
without an allowed bearer token, while ``/mutate``, ``/healthz`` and ``/readyz`` need
none (the API server and the kubelet call them)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry
from webhook_builders import dynamic, node, pod, review

from serving.metrics_auth import ScrapeGuard
from webhook.app import create_webhook_app
from webhook.config import WebhookConfig

SNAP = dynamic(node("h0"))


@dataclass(frozen=True)
class Who:
    username: str


TOKENS = {"prom": Who("prometheus"), "nosy": Who("nosy")}


def authenticate(token: str) -> Who | None:
    if token == "down":
        raise TimeoutError("TokenReview: read timed out")
    return TOKENS.get(token)


def authorize(who: Who, path: str, verb: str) -> bool:
    return who.username == "prometheus" and (path, verb) == ("/metrics", "get")


@pytest.mark.parametrize(("headers", "status"), [
    ({}, 401),
    ({"Authorization": "Bearer forged"}, 401),
    ({"Authorization": "Bearer nosy"}, 403),
    ({"Authorization": "Bearer down"}, 503),
    ({"Authorization": "Bearer prom"}, 200),
])
def test_webhook_metrics_guarded(headers: dict[str, str], status: int) -> None:
    app = create_webhook_app(lambda: SNAP, CollectorRegistry(), WebhookConfig(),
                     metrics_guard=ScrapeGuard(authenticate, authorize))
    client = app.test_client()
    r = client.get("/metrics", headers=headers)
    assert r.status_code == status
    if status == 200:
        assert b"gpupack_webhook_reviews_total" in r.data
    else:
        assert r.mimetype == "application/json" and r.get_json()["error"]
        assert b"gpupack_webhook" not in r.data
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    out = client.post("/mutate", json=review(pod(annotations={"gpupack.io/gpu-memory": "5Gi"})))
    assert out.status_code == 200 and out.get_json()["response"]["allowed"] is True


def test_webhook_metrics_open_without_a_guard() -> None:
    client = create_webhook_app(lambda: SNAP, CollectorRegistry(), WebhookConfig()).test_client()
    assert client.get("/metrics").status_code == 200
