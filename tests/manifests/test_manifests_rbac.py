"""Least privilege: what each ServiceAccount can do, computed from every binding."""

from __future__ import annotations

import pytest
from manifests_helpers import Obj, container_account, find, find_all

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
            # The node agent's account is in its own namespace (Pod Security).
            assert s["kind"] == "ServiceAccount" and s["namespace"] == (
                "gpupack-node-agent" if s["name"] == "gpupack-node-agent" else "gpupack")
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
        # kube-scheduler's own roles (system:kube-scheduler also reviews the tokens of its
        # secure port's callers).
        "gpupack-scheduler": {
            "ClusterRole/system:kube-scheduler@*", "ClusterRole/system:volume-scheduler@*",
            "Role/extension-apiserver-authentication-reader@kube-system"},
        "gpupack-extender": {AUTH_DELEGATOR},
        "gpupack-webhook": {AUTH_DELEGATOR},
        "gpupack-node-agent": {AUTH_DELEGATOR}}
    # What the end-to-end tests saw each account use (tests/e2e/test_e2e_z_rbac.py checks
    # the chart's grants against the API server's audit log): kube-scheduler's LeaseLock
    # gets, creates and updates; the extender only reads the Lease.
    leases = {("gpupack", "coordination.k8s.io", "leases", v)
              for v in ("get", "create", "update")}
    # kube-scheduler's account holds only its built-in roles and its Lease; the
    # extender's (issue 35 item 4) the extender's grants and nothing of kube-scheduler's.
    assert own["gpupack-scheduler"] == leases
    # Informers only list and watch; Bindings are posted to the namespaced bindings
    # resource and carry the annotations (no pod patch; a pod's status only, for the
    # condition that requeues a refused group member); group records only in gpupack's
    # own namespace.
    # Group rights: ResourceQuotas by an informer, LeaderWorkerSets by a periodic list;
    # kube-scheduler's PodGroups and Workloads by an informer while served.
    dra = {("*", "resource.k8s.io", res, v)
           for res in ("resourceslices", "deviceclasses", "resourceclaims",
                       "resourceclaimtemplates", "devicetaintrules")
           for v in ("list", "watch")}
    assert own["gpupack-extender"] == (
        core("*", "nodes", "list", "watch")
        | core("*", "pods", "list", "watch") | core("*", "pods/status", "patch")
        | core("*", "bindings", "create") | {("gpupack", "coordination.k8s.io", "leases", "get")}
        | core("gpupack", "configmaps", "get", "list", "watch", "create", "update", "delete")
        | core("*", "resourcequotas", "list", "watch")
        | {("*", "leaderworkerset.x-k8s.io", "leaderworkersets", "list")} | dra
        # A Warning Event on a bound pod whose inputs cannot be read (kube.worst_case).
        | core("*", "events", "create")
        | {("*", "scheduling.k8s.io", r, v) for r in ("podgroups", "workloads")
           for v in ("list", "watch")})
    # The webhook reads what DRA nodes offer (docs/dra.md) as the extender does.
    assert own["gpupack-webhook"] == (core("*", "nodes", "list", "watch")
                                      | core("*", "pods", "list", "watch") | dra)
    assert own["gpupack-node-agent"] == core("*", "nodes", "patch") | core("*", "pods", "list")
    accounts = {o["metadata"]["name"] for o in find_all(objs, "ServiceAccount")}
    assert accounts == set(own)
    for kind in ("Deployment", "DaemonSet"):
        for o in find_all(objs, kind):
            assert o["spec"]["template"]["spec"]["serviceAccountName"] in accounts


@pytest.mark.parametrize("which", ["base", "helm_default"])
def test_each_container_holds_only_its_own_token(which: str,
                                                request: pytest.FixtureRequest) -> None:
    """kube-scheduler and the extender share a pod but not a token: the pod mounts no
    token by default, kube-scheduler gets a projected (bound, rotated) token of the pod's
    account, the extender the token Secret of its own account; neither sees the other's
    (issue 35 item 4)."""
    objs: list[Obj] = request.getfixturevalue(which)
    spec = find(objs, "Deployment", "gpupack-scheduler")["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert not spec.get("shareProcessNamespace")  # /proc/<pid>/root would share files
    by_name = {c["name"]: c for c in spec["containers"]}
    assert container_account(objs, spec, by_name["kube-scheduler"]) == "gpupack-scheduler"
    assert container_account(objs, spec, by_name["extender"]) == "gpupack-extender"
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounted = {c: {m["name"] for m in by_name[c].get("volumeMounts", [])} for c in by_name}
    token_volumes = {n for n, v in volumes.items() if "secret" in v or any(
        "serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))}
    assert mounted["kube-scheduler"] & token_volumes == {"kube-scheduler-token"}
    assert mounted["extender"] & token_volumes == {"extender-token"}
    projected = volumes["kube-scheduler-token"]["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}} in projected
    sa = find(objs, "ServiceAccount", "gpupack-extender")
    assert sa["automountServiceAccountToken"] is False
