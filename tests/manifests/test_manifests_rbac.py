"""Least privilege: what each ServiceAccount can do, computed from every binding."""

from __future__ import annotations

import pytest
from manifests_helpers import Obj, find_all

Grant = tuple[str, str, str, str]  # (namespace or "*", apiGroup, resource, verb)

BUILTIN = {"system:kube-scheduler", "system:volume-scheduler",
           "extension-apiserver-authentication-reader", "system:auth-delegator"}
# Every account that serves /metrics reviews its scrapers' tokens (TokenReview) and
# rights (SubjectAccessReview): create on both, the whole of system:auth-delegator.
AUTH_DELEGATOR = "ClusterRole/system:auth-delegator@*"


def _rules(o: Obj, ns: str) -> set[Grant]:
    out = set()
    for r in o.get("rules", []):
        assert "nonResourceURLs" not in r and "resourceNames" not in r
        for g in r["apiGroups"]:
            for res in r["resources"]:
                for v in r["verbs"]:
                    assert "*" not in (g, res, v), f"wildcard in {o['metadata']['name']}"
                    out.add((ns, g, res, v))
    return out


def grants(objs: list[Obj]) -> tuple[dict[str, set[Grant]], dict[str, set[str]]]:
    """Per ServiceAccount: the grants of our own roles, and the built-in roles bound."""
    roles = {("ClusterRole", o["metadata"]["name"]): o for o in find_all(objs, "ClusterRole")}
    roles |= {("Role", o["metadata"]["name"]): o for o in find_all(objs, "Role")}
    own: dict[str, set[Grant]] = {}
    builtin: dict[str, set[str]] = {}
    for b in find_all(objs, "ClusterRoleBinding") + find_all(objs, "RoleBinding"):
        ns = b["metadata"].get("namespace", "*")
        ref = b["roleRef"]
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["namespace"] == "gpupack"
            key = s["name"]
            if ref["name"] in BUILTIN:
                builtin.setdefault(key, set()).add(f"{ref['kind']}/{ref['name']}@{ns}")
                continue
            role = roles[(ref["kind"], ref["name"])]
            own.setdefault(key, set()).update(_rules(role, ns))
    return own, builtin


def core(ns: str, res: str, *verbs: str) -> set[Grant]:
    return {(ns, "", res, v) for v in verbs}


@pytest.mark.parametrize("which", ["base", "helm_default"])
def test_least_privilege(which: str, request: pytest.FixtureRequest) -> None:
    objs: list[Obj] = request.getfixturevalue(which)
    own, builtin = grants(objs)
    assert builtin == {
        "gpupack-scheduler": {
            "ClusterRole/system:kube-scheduler@*", "ClusterRole/system:volume-scheduler@*",
            "Role/extension-apiserver-authentication-reader@kube-system", AUTH_DELEGATOR},
        "gpupack-webhook": {AUTH_DELEGATOR},
        "gpupack-node-agent": {AUTH_DELEGATOR}}
    # What the end-to-end tests saw each account use (tests/e2e/test_e2e_z_rbac.py checks
    # the chart's grants against the API server's audit log): kube-scheduler's LeaseLock
    # gets, creates and updates; the extender only reads the Lease.
    leases = {("gpupack", "coordination.k8s.io", "leases", v)
              for v in ("get", "create", "update")}
    # Informers only list and watch; Bindings are posted to the namespaced bindings
    # resource and carry the annotations (no pod patch; a pod's status only, for the
    # condition that requeues a refused group member); group records only in gpupack's
    # own namespace.
    # Group rights: ResourceQuotas by an informer, LeaderWorkerSets by a periodic list.
    dra = {("*", "resource.k8s.io", res, v)
           for res in ("resourceslices", "deviceclasses", "resourceclaims",
                       "resourceclaimtemplates", "devicetaintrules")
           for v in ("list", "watch")}
    assert own["gpupack-scheduler"] == (
        core("*", "nodes", "list", "watch")
        | core("*", "pods", "list", "watch") | core("*", "pods/status", "patch")
        | core("*", "bindings", "create") | leases
        | core("gpupack", "configmaps", "get", "list", "watch", "create", "update", "delete")
        | core("*", "resourcequotas", "list", "watch")
        | {("*", "leaderworkerset.x-k8s.io", "leaderworkersets", "list")} | dra)
    # The webhook reads what DRA nodes offer (docs/dra.md) as the extender does.
    assert own["gpupack-webhook"] == (core("*", "nodes", "list", "watch")
                                      | core("*", "pods", "list", "watch") | dra)
    assert own["gpupack-node-agent"] == core("*", "nodes", "patch") | core("*", "pods", "list")
    accounts = {o["metadata"]["name"] for o in find_all(objs, "ServiceAccount")}
    assert accounts == set(own)
    for kind in ("Deployment", "DaemonSet"):
        for o in find_all(objs, kind):
            assert o["spec"]["template"]["spec"]["serviceAccountName"] in accounts
