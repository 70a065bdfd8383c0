"""Metrics behind delegated authentication, as the manifests deploy it: every
ServiceMonitor sends Prometheus' ServiceAccount token, every workload a ServiceMonitor
scrapes runs as an account that may review tokens (system:auth-delegator), and no
container turns the check off."""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from manifests_helpers import Obj, container_account, find_all

SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
WORKLOADS = ("Deployment", "DaemonSet")


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def scraped_accounts(objs: list[Obj]) -> set[str]:
    """The ServiceAccounts of the containers behind every ServiceMonitor (the one that
    serves the Service's port)."""
    out: set[str] = set()
    for sm in find_all(objs, "ServiceMonitor"):
        sel = sm["spec"]["selector"]["matchLabels"]
        services = [s for s in find_all(objs, "Service")
                    if _selects(sel, s["metadata"].get("labels", {}))]
        assert services, sm["metadata"]["name"]
        for svc in services:
            pods = [w for kind in WORKLOADS for w in find_all(objs, kind)
                    if _selects(svc["spec"]["selector"],
                                w["spec"]["template"]["metadata"]["labels"])]
            assert pods, svc["metadata"]["name"]
            ports = {p.get("targetPort") for p in svc["spec"]["ports"]}
            for w in pods:
                spec = w["spec"]["template"]["spec"]
                out |= {container_account(objs, spec, c) for c in spec["containers"]
                        if {p.get("name") for p in c.get("ports", [])} & ports}
    return out


def auth_delegators(objs: list[Obj]) -> set[str]:
    return {s["name"] for b in find_all(objs, "ClusterRoleBinding")
            if b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                "kind": "ClusterRole", "name": "system:auth-delegator"}
            for s in b["subjects"] if s["kind"] == "ServiceAccount"}


@pytest.mark.parametrize("which", ["base", "helm_default"])
def test_servicemonitors_send_a_token(which: str, request: pytest.FixtureRequest) -> None:
    objs: list[Obj] = request.getfixturevalue(which)
    endpoints = {sm["metadata"]["name"]: sm["spec"]["endpoints"]
                 for sm in find_all(objs, "ServiceMonitor")}
    assert len(endpoints) == 3
    for name, eps in endpoints.items():
        for ep in eps:
            assert ep["bearerTokenFile"] == SA_TOKEN, name
            # The scheme stays what each listener serves: HTTPS only on the webhook.
            assert ep.get("scheme", "http") == ("https" if "webhook" in name else "http")


@pytest.mark.parametrize("which", ["base", "helm_default"])
def test_scraped_accounts_review_tokens(which: str, request: pytest.FixtureRequest) -> None:
    objs: list[Obj] = request.getfixturevalue(which)
    scraped = scraped_accounts(objs)
    assert scraped == {"gpupack-extender", "gpupack-webhook", "gpupack-node-agent"}
    assert auth_delegators(objs) == scraped


@pytest.mark.parametrize("which", ["base", "helm_default"])
def test_no_container_turns_metrics_auth_off(which: str,
                                            request: pytest.FixtureRequest) -> None:
    objs: list[Obj] = request.getfixturevalue(which)
    for kind in WORKLOADS:
        for w in find_all(objs, kind):
            for c in w["spec"]["template"]["spec"]["containers"]:
                argv = list(c.get("command") or []) + list(c.get("args") or [])
                assert "--metrics-auth=none" not in argv
                assert not any(a == "--metrics-auth" and b == "none"
                               for a, b in pairwise(argv)), c["name"]


def test_no_agent_no_agent_binding(render_helm: Callable[[dict[str, Any] | None],
                                                         list[Obj]]) -> None:
    objs = render_helm({"nodeAgent": {"enabled": False}})
    assert auth_delegators(objs) == {"gpupack-extender", "gpupack-webhook"}
    assert scraped_accounts(objs) == {"gpupack-extender", "gpupack-webhook"}
