"""RBAC as the chart grants it, judged by the API server's audit log of every request
gpupack's ServiceAccounts made during the session. This module's name sorts last on
purpose: it reads what the other end-to-end tests exercised.

- Nothing gpupack did was refused (no 403 in the audit log).
- Every permission the chart's own Roles and ClusterRoles grant was used by some test
  (kube-scheduler's built-in roles, which the chart only binds, are its business).
- The node agent's Node patch went through with its own token.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from cluster import wait_for
from controlplane import (
    AGENT_NAMESPACE,
    AGENT_NODE,
    CHART_VALUES,
    EXTRA_AUDIT_LOGS,
    NAMESPACE,
    Stack,
    render_chart,
)
from test_e2e_agent import PROBE_AGENT


def audit_events(stack: Stack) -> list[dict[str, Any]]:
    path = stack.dir / "logs" / "audit.log"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def other_stacks_events() -> list[dict[str, Any]]:
    """The audit logs of the other stacks this session started (EXTRA_AUDIT_LOGS: the
    Workload API tests' stack with GenericWorkload on, where the PodGroup and Workload
    watches happen; on the session's stack their list answers 404)."""
    out = []
    for path in EXTRA_AUDIT_LOGS:
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


def grants(objs: Iterable[Mapping[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    """ServiceAccount -> {(apiGroup, resource, verb)} from the chart's own roles."""
    roles = {(o["kind"], o["metadata"]["name"]): o.get("rules", []) for o in objs
             if o.get("kind") in ("Role", "ClusterRole")}
    out: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for b in objs:
        if b.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = b["roleRef"]
        rules = roles.get((ref["kind"], ref["name"]))
        if rules is None:
            continue  # a built-in role (system:kube-scheduler, ...), not the chart's
        for subject in b.get("subjects", []):
            if subject.get("kind") != "ServiceAccount":
                continue
            for rule in rules:
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        for verb in rule.get("verbs", []):
                            out[subject["name"]].add((group, resource, verb))
    return out


def used(events: Iterable[Mapping[str, Any]]) -> dict[str, set[tuple[str, str, str]]]:
    prefixes = [f"system:serviceaccount:{ns}:" for ns in (NAMESPACE, AGENT_NAMESPACE)]
    out: dict[str, set[tuple[str, str, str]]] = defaultdict(set)
    for e in events:
        user = e.get("user", {}).get("username", "")
        ref = e.get("objectRef") or {}
        prefix = next((p for p in prefixes if user.startswith(p)), None)
        if prefix is None or "resource" not in ref:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        out[user[len(prefix):]].add((ref.get("apiGroup", ""), resource, e["verb"]))
    return out


def test_agent_patched_its_node(core: Any) -> None:
    def annotated() -> Any:
        ann = core.read_node(AGENT_NODE).metadata.annotations or {}
        return ann.get("gpupack.io/inventory")

    inventory = json.loads(wait_for(annotated, 60, "the agent's inventory annotation"))
    assert inventory, inventory


def _restarting(stack: Stack, t: float) -> bool:
    """Within a restart of kube-apiserver: its RBAC authorizer answers 403 for a moment
    after it starts serving, before its informers have synced (an API server property,
    not a missing grant; the same request is allowed a second later)."""
    return any(a <= t <= b + 5.0 for a, b in stack.starts("apiserver"))


def _audit_time(e: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")).timestamp()


def test_nothing_refused(stack: Stack) -> None:
    """The audit log holds every answer the API server gave gpupack's accounts, so it is
    the record of refusals (gpupack's own logs also say 403 when the webhook denies a pod,
    which is not a permission problem)."""
    events = audit_events(stack)
    assert any(e["user"]["username"].endswith(":gpupack-webhook") for e in events)
    refused = [(e["user"]["username"], e["verb"], e.get("objectRef"))
               for e in events if e.get("responseStatus", {}).get("code") == 403
               and not _restarting(stack, _audit_time(e))
               and e.get("userAgent") != PROBE_AGENT]  # refused on purpose
    assert refused == []


def test_every_grant_is_exercised(stack: Stack) -> None:
    granted = grants(render_chart("eA==", CHART_VALUES))
    done = used(audit_events(stack) + other_stacks_events())
    unused = {sa: sorted(g - done.get(sa, set())) for sa, g in granted.items()}
    assert {sa: u for sa, u in unused.items() if u} == {}, (
        "granted but never used in the end-to-end tests: remove the grant or exercise it")


def test_kube_scheduler_and_the_extender_each_call_as_their_own_account(stack: Stack) -> None:
    """The scheduler pod's two programs hold two accounts (issue 35 item 4): every
    request of kube-scheduler's account came from kube-scheduler, every request the
    extender made (its Python client) came under the extender's account, and what the
    extender did covers its work (caches, binds, conditions, records, the Lease)."""
    accounts = stack.state()["service_accounts"]
    assert accounts["extender"] != accounts["scheduler"], accounts
    prefix = f"system:serviceaccount:{NAMESPACE}:"
    events = audit_events(stack)
    by_scheduler = [e for e in events if e["user"]["username"] == prefix + accounts["scheduler"]]
    by_extender = [e for e in events if e["user"]["username"] == prefix + accounts["extender"]]
    assert by_scheduler and by_extender
    agents = {e.get("userAgent", "").split("/")[0] for e in by_scheduler}
    assert agents == {"kube-scheduler"}, agents
    assert not [e for e in by_extender if e.get("userAgent", "").startswith("kube-scheduler")]
    done = {((e.get("objectRef") or {}).get("resource", ""), e["verb"]) for e in by_extender}
    assert {("nodes", "list"), ("nodes", "watch"), ("pods", "list"), ("pods", "watch"),
            ("bindings", "create"), ("pods", "patch"), ("configmaps", "create"),
            ("leases", "get"), ("leaderworkersets", "list")} <= done, sorted(done)


def test_the_extenders_account_was_refused_what_is_kube_schedulers(stack: Stack) -> None:
    """The probe of test_e2e_tenants.py with the extender's own token, as the audit log
    recorded it: deleting a pod, writing PVs and taking kube-scheduler's Lease refused."""
    accounts = stack.state()["service_accounts"]
    user = f"system:serviceaccount:{NAMESPACE}:{accounts['extender']}"
    refused = {((e.get("objectRef") or {}).get("resource"), e["verb"])
               for e in audit_events(stack)
               if e["user"]["username"] == user and e.get("userAgent") == PROBE_AGENT
               and e.get("responseStatus", {}).get("code") == 403}
    assert {("pods", "delete"), ("persistentvolumes", "create"), ("persistentvolumes", "patch"),
            ("leases", "update")} <= refused, sorted(refused)
