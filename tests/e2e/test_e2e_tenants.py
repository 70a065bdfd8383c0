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

import contextlib
import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    LWS,
    MANUAL_SCHEDULER,
    bind_with_records,
    bound,
    create_nodes,
    create_pods,
    force_delete_pods,
    group_outcomes,
    h100_whole,
    l40s_shared,
    lws_member,
    pending_report,
    pod,
    pods_in,
    wait_for,
    wait_for_webhook,
)
from conftest import Space
from controlplane import (
    E2E_GROUP_TTL_S,
    NAMESPACE,
    Stack,
    active_replica,
    extender_metrics,
    metric_sample,
)
from tenants import (
    CLIQUE,
    LWS_CRD,
    MIG,
    SHARED,
    admitted,
    decision,
    forge,
    issue_pool,
    labelled,
    post_review,
    ready,
    records,
    refused,
    review,
)


def _pool(core: Any, space: Space) -> str:
    """The issue's pool in ``space``'s own node pool."""
    space.nodes += issue_pool(core, space.name)
    return space.name


def test_only_the_api_servers_certificate_may_post_reviews(
        stack: Stack, core: Any, space: Space) -> None:
    ns = space.namespace()
    pool = _pool(core, space)
    wait_for_webhook(core, ns, pod("probe", annotations={"gpupack.io/gpu-memory": "30Gi"},
                                   pool=pool), MIG)
    body = review(pod("forged", annotations={"gpupack.io/gpu-memory": "30Gi"}, pool=pool),
                   f"{ns}-evil")
    status, answer = post_review(stack, body, None)
    assert status == 401 and "client certificate is required" in answer["error"], answer
    # A certificate of the cluster's own CA, but not the API server's name.
    status, answer = post_review(stack, body, "admin")
    assert status == 403 and "e2e-admin" in answer["error"], answer
    # What the API server itself sends is answered.
    status, answer = post_review(stack, body, "webhook-client")
    assert status == 200 and answer["response"]["allowed"] is True
    # And pods created through the API server are sized as ever.
    assert decision(core, ns, pool)[0] == MIG


def test_forged_reviews_of_another_namespace_leave_a_victims_decision(
        stack: Stack, core: Any, space: Space, capsys: Any) -> None:
    ns = space.namespace()
    pool = _pool(core, space)
    wait_for_webhook(core, ns, pod("probe", annotations={"gpupack.io/gpu-memory": "30Gi"},
                                   pool=pool), MIG)
    before = decision(core, ns, pool)
    assert before[0] == MIG
    # Without the certificate nothing is even read.
    assert set(forge(stack, pool, f"{ns}-evil", 24, None)) == {401}
    assert decision(core, ns, pool) == before
    # With it (as if the webhook could not verify its caller): 24 forged claims, as many
    # as the pool has slices and shares, all for the other namespace.
    assert set(forge(stack, pool, f"{ns}-evil", 24, "webhook-client")) == {200}
    after = decision(core, ns, pool)
    # The control: 8 such reviews naming the victim's namespace are counted there.
    assert set(forge(stack, pool, ns, 8, "webhook-client")) == {200}
    own = decision(core, ns, pool)
    with capsys.disabled():
        print(f"\n  e2e forged reviews: victim before {before[0]}, after 24 forged for "
              f"another namespace {after[0]}, after 8 naming its own {own[0]}")
    assert after == before
    assert own[0] == SHARED, own


# ---- item 2: reservations within a tenant's rights -----------------------------------------

def test_reservations_stay_within_a_namespaces_rights(
        core: Any, space: Space, capsys: Any) -> None:
    """The issue's attack: two pending 1-GPU pods labelled as groups of 64 in one
    namespace, on a 16-node cluster of 128 GPUs. One namespace's reservations may hold 64
    (--max-namespace-reserved-gpus in this stack): the second waits until the first's
    reservation expires. And a group whose reservation expired, its members never come,
    is not reserved again at once; a new member pod makes it due at once."""
    evil, other = space.namespace(), space.namespace("-b")
    p = space.name
    space.nodes += create_nodes(core, [h100_whole(f"{p}-{i:02d}", p) for i in range(16)])
    create_pods(core, evil, [labelled("a", 64, 1, p), labelled("b", 64, 1, p)])
    create_pods(core, other, [labelled("x", 2, 8, p)])
    start = time.monotonic()
    first = wait_for(lambda: records(core, evil), 30, "a reservation in the namespace")
    assert len(first) == 1 and len(next(iter(first.values()))["m"]) == 64, first
    (held_by,) = first
    waiting = "b" if held_by.endswith("/a") else "a"
    reason = wait_for(lambda: (lambda r: r if "in reservations" in r else None)(
        pending_report(core, evil)), 30, "the second group's reason")
    assert f"namespace {evil} may hold 0 more GPUs in reservations" in reason or \
        f"namespace {evil} may hold 1 more GPUs in reservations" in reason, reason
    assert records(core, other), "another namespace's group is not charged for evil's"
    time.sleep(5)
    assert set(records(core, evil)) == {held_by}, "two groups of 64 held in one namespace"
    # The first expires (TTL 60 s): the second gets the namespace's room.
    second = wait_for(lambda: (lambda r: r if f"{evil}/{waiting}" in r else None)(
        records(core, evil)), E2E_GROUP_TTL_S + 30, "the second group after the expiry")
    assert held_by not in second, "the expired group re-reserved beside the second"
    # x (other namespace) expired too: its worker never came. The pool has room, yet it
    # is not reserved again at once ...
    wait_for(lambda: not records(core, other), 30, "x's reservation to expire")
    expired = time.monotonic()
    time.sleep(15)
    assert not records(core, other), "an expired group re-reserved at once"
    # ... until its worker appears.
    create_pods(core, other, [labelled("x", 2, 8, p, worker=1)])
    wait_for(lambda: len(bound(pods_in(core, other))) == 2, 30, "group x to bind")
    with capsys.disabled():
        print(f"\n  e2e reservations: 2 groups of 64 in one namespace -> one held at a time "
              f"(second reserved {time.monotonic() - start:.0f}s in, after the first "
              f"expired); an expired group waited {time.monotonic() - expired:.0f}s, until "
              "its worker came")


# Namespaces and LeaderWorkerSets of the tests below, made before the extenders list.
LWS_NS, LWS_EVIL = "e2e-tenants-lws", "e2e-tenants-lws-evil"
LWS_OBJECTS = ((LWS_NS, "big", 80, None), (LWS_NS, "vllm", 2, CLIQUE),
               (LWS_EVIL, "squatter", 1, CLIQUE))


def _lws_lists(stack: Stack, after: float) -> int:
    """The extenders' lists of LeaderWorkerSets since ``after`` (the audit log)."""
    n = 0
    for line in (stack.dir / "logs" / "audit.log").read_text().splitlines():
        e = json.loads(line)
        ref = e.get("objectRef") or {}
        if ref.get("resource") == "leaderworkersets" and e.get("verb") == "list" and \
                e.get("stage") == "ResponseComplete" and _when(e) > after:
            n += 1
    return n


def _when(e: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(e["stageTimestamp"].replace("Z", "+00:00")).timestamp()


@pytest.fixture(scope="module")
def lws_api(stack: Stack, admin: Any, core: Any) -> Iterator[Any]:
    """The LeaderWorkerSet API (its CRD, schema-less: no controller runs here; the tests
    create the pods as the controller would) and the tests' objects, once every extender
    has listed them (each lists every 30 s). The CRD stays for the rest of the session."""
    from controlplane import ensure_namespace
    from kubernetes import client

    ext = client.ApiextensionsV1Api(admin)
    with contextlib.suppress(client.ApiException):
        ext.create_custom_resource_definition(LWS_CRD)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(LWS_CRD["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True"
                   for c in (crd.status.conditions or []))

    wait_for(established, 30, "the LeaderWorkerSet CRD")
    api = client.CustomObjectsApi(admin)
    for ns in (LWS_NS, LWS_EVIL):
        ensure_namespace(admin, ns)
    for ns, name, size, exclusive in LWS_OBJECTS:
        meta: dict[str, Any] = {"name": name, "namespace": ns}
        if exclusive:
            meta["annotations"] = {LWS + "exclusive-topology": exclusive}
        api.create_namespaced_custom_object(
            "leaderworkerset.x-k8s.io", "v1", ns, "leaderworkersets",
            {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
             "metadata": meta, "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": size}}})
    made = time.time()
    replicas = len(stack.state()["replicas"])
    wait_for(lambda: _lws_lists(stack, made) >= replicas, 45,
             "each extender to list the LeaderWorkerSets", interval_s=1.0)
    try:
        yield api
    finally:
        for ns in (LWS_NS, LWS_EVIL):
            force_delete_pods(core, ns)


def test_a_group_sized_by_its_leaderworkerset_is_capped(
        lws_api: Any, core: Any, space: Space) -> None:
    p = space.name
    space.nodes += create_nodes(core, [h100_whole(f"{p}-{i}", p) for i in range(2)])
    # LeaderWorkerSet "big": 80 pods of 1 GPU, over --max-group-gpus 64; the pod's own
    # annotation says 2.
    create_pods(core, LWS_NS, [lws_member("big", 0, 2, 1, p)])
    reason = wait_for(lambda: (lambda r: r if "--max-group-gpus" in r else None)(
        pending_report(core, LWS_NS)), 60, "the group's refusal")
    assert f"sized by LeaderWorkerSet {LWS_NS}/big), more than --max-group-gpus 64" in reason
    assert not records(core, LWS_NS)
    force_delete_pods(core, LWS_NS)


def test_exclusive_domains_of_other_namespaces_leave_a_group_its_clique(
        lws_api: Any, core: Any, space: Space) -> None:
    """One 1-GPU "group" per NVLink clique in another namespace, asking for exclusive
    cliques: forged (LWS labels, no object, bound by hand) in one clique, a real
    LeaderWorkerSet of that namespace in the other. A real group of this namespace, whose
    LeaderWorkerSet asks for exclusive cliques, is still reserved and bound."""
    p = space.name
    cliques = [f"{p}-c0", f"{p}-c1"]
    space.nodes += create_nodes(core, [h100_whole(f"{p}-{c}-{i}", p, clique=cliques[c])
                                       for c in (0, 1) for i in range(3)])
    forged = lws_member("forged", 0, 1, 1, p)
    forged["metadata"]["annotations"][LWS + "exclusive-topology"] = CLIQUE
    forged["spec"]["schedulerName"] = MANUAL_SCHEDULER
    create_pods(core, LWS_EVIL, [forged])
    bind_with_records(core, LWS_EVIL, "forged-0", f"{p}-0-0", {})
    squatter = lws_member("squatter", 0, 1, 1, p)
    squatter["metadata"]["annotations"][LWS + "exclusive-topology"] = CLIQUE
    squatter["spec"]["nodeSelector"][CLIQUE] = cliques[1]
    create_pods(core, LWS_EVIL, [squatter])
    wait_for(lambda: "squatter-0" in bound(pods_in(core, LWS_EVIL)), 60, "the squatter's bind")
    # The real group: 2 x 8 GPUs in one clique, exclusive by its LeaderWorkerSet.
    members = [lws_member("vllm", w, 2, 8, p) for w in range(2)]
    for m in members:
        m["metadata"]["annotations"][LWS + "exclusive-topology"] = CLIQUE
    create_pods(core, LWS_NS, members)
    wait_for(lambda: len(bound(pods_in(core, LWS_NS))) == 2, 60,
             f"the real group to bind ({pending_report(core, LWS_NS)})")
    group = group_outcomes(core, pods_in(core, LWS_NS))["vllm"]
    assert len(group.cliques) == 1 and len(group.nodes) == 2, group
    for ns in (LWS_NS, LWS_EVIL):
        force_delete_pods(core, ns)


# ---- item 3: a bound pod whose inputs do not parse is counted at its worst -------------------


def test_a_share_rewritten_after_binding_keeps_its_gpu_after_a_restart(
        stack: Stack, admin: Any, core: Any, space: Space, scraper: str, capsys: Any) -> None:
    """A 40Gi share is bound on a one-GPU L40S; its author then sets its gpu-memory to
    "lots". After the extender restarts (a fresh list), the pod is counted at its worst
    (its whole GPU): a 20Gi share waits rather than landing beside it (60 GiB on a 45 GiB
    GPU, as when the pod was skipped). A metric and an Event name it."""
    ns = space.namespace()
    p = space.name
    space.nodes += create_nodes(core, [l40s_shared(f"{p}-l40s", p, gpus=1)])

    def share(name: str, memory: str) -> dict[str, Any]:
        return pod(name, pool=p, limits={SHARED: "1"}, scheduler="gpupack",
                   annotations={"gpupack.io/gpu-memory": memory})

    wait_for(lambda: admitted(core, ns, share("probe", "40Gi")), 30,
             "the webhook to see the new L40S")
    create_pods(core, ns, [share("big", "40Gi")])
    wait_for(lambda: "big" in bound(pods_in(core, ns)), 60, "the 40Gi share's bind")
    core.patch_namespaced_pod("big", ns, {"metadata": {"annotations": {
        "gpupack.io/gpu-memory": "lots"}}})
    active = "extender" + active_replica(stack, admin)
    stack.restart(active)
    wait_for(lambda: ready(stack, active), 60, "the restarted extender to be ready")
    create_pods(core, ns, [share("small", "20Gi")])
    time.sleep(10)
    assert "small" not in bound(pods_in(core, ns)), "a share was put beside an unreadable one"

    def named() -> Any:
        fams = extender_metrics(stack, admin, scraper)
        return None if fams is None else metric_sample(
            fams, "gpupack_pod_counted_worst_case", namespace=ns, pod="big")

    assert wait_for(named, 30, "the metric naming the pod") == 1.0
    event = wait_for(lambda: [e for e in core.list_namespaced_event(ns).items
                              if e.reason == "GpupackInputsUnreadable"
                              and e.involved_object.name == "big"], 30, "the Event")
    assert "gpupack.io/gpu-memory: 'lots'" in event[0].message and event[0].type == "Warning"
    with capsys.disabled():
        print(f"\n  e2e unreadable share: counted at its worst after a restart; event: "
              f"{event[0].message[:90]}...")


# ---- item 4: the extender holds only the extender's rights --------------------------------


def test_the_extenders_account_cannot_act_as_kube_scheduler(
        stack: Stack, core: Any, space: Space) -> None:
    """What a compromised extender could do with kube-scheduler's account (delete pods,
    write PVs, take the scheduler's Lease) is refused to its own; and what its grants
    allow in general is narrowed by the chart's policies to what the extender writes
    (a Node's MIG label, gpupack's pod conditions, its own ConfigMaps)."""
    from controlplane import RELEASE, _api
    from kubernetes import client
    from test_e2e_agent import PROBE_AGENT

    api = _api(stack.dir / "kubeconfigs" / "extender")
    api.user_agent = PROBE_AGENT
    ext = client.CoreV1Api(api)
    coordination = client.CoordinationV1Api(api)
    ns = space.namespace()
    node = f"{space.name}-n"
    space.nodes += create_nodes(core, [h100_whole(node, space.name)])
    victim = create_pods(core, ns, [pod("victim", pool=space.name,
                                        scheduler=MANUAL_SCHEDULER)])[0]
    # kube-scheduler's rights, not the extender's (RBAC).
    refused(lambda: ext.delete_namespaced_pod("victim", ns, grace_period_seconds=0))
    refused(lambda: ext.create_persistent_volume({
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/tmp/x"}}}))
    refused(lambda: ext.patch_persistent_volume("any", {"metadata": {"labels": {"x": "1"}}}))
    lease = coordination.read_namespaced_lease(f"{RELEASE}-scheduler", NAMESPACE)
    lease.spec.holder_identity = "evil_0"
    refused(lambda: coordination.replace_namespaced_lease(f"{RELEASE}-scheduler", NAMESPACE,
                                                           lease))
    # Its grants, narrowed by the chart's ValidatingAdmissionPolicies.
    refused(lambda: ext.patch_node(node, {"spec": {"taints": [
        {"key": "evil", "effect": "NoSchedule"}]}}), "may change only a Node's")
    refused(lambda: ext.patch_node(node, {"metadata": {"labels": {
        "gpupack.io/mig-reconfigure": "true"}}}), "may change only a Node's")
    ext.patch_node(node, {"metadata": {"annotations": {"gpupack.io/mig-change": "probe"}}})
    refused(lambda: ext.patch_namespaced_pod_status("victim", ns, {"metadata": {
        "labels": {"app": "evil"}}}), "only gpupack.io/ conditions")
    ext.patch_namespaced_pod_status("victim", ns, {"status": {"conditions": [
        {"type": "gpupack.io/E2EProbe", "status": "True"}]}})
    config = ext.read_namespaced_config_map(f"{RELEASE}-scheduler-config", NAMESPACE)
    config.data["evil"] = "1"
    refused(lambda: ext.replace_namespaced_config_map(
        f"{RELEASE}-scheduler-config", NAMESPACE, config), "writes only its own ConfigMaps")
    refused(lambda: ext.create_namespaced_config_map(NAMESPACE, {
        "metadata": {"name": "evil"}, "data": {}}), "writes only its own ConfigMaps")
    conds = {c.type for c in core.read_namespaced_pod("victim", ns).status.conditions or []}
    assert "gpupack.io/E2EProbe" in conds
    assert victim["metadata"]["name"] == "victim"
    api.close()


# ---- item 5: the placement records through pods/status -------------------------------------


def test_a_status_update_may_not_touch_the_placement_records(core: Any, space: Space) -> None:
    """A pods/status update may change a pod's annotations (the API server keeps only
    its spec and owner references): the chart's placement-records policy covers it too,
    for every user (these requests are the cluster admin's)."""
    ns = space.namespace()
    create_pods(core, ns, [pod("p", scheduler=MANUAL_SCHEDULER)])
    body = refused(lambda: core.patch_namespaced_pod_status("p", ns, {"metadata": {
        "annotations": {"gpupack.io/gpus": "0,1"}}}), "gpupack.io/gpus")
    assert "placement records are written only through the pod's Binding" in body
    # Other annotations may still change through the status (kubelet, controllers).
    core.patch_namespaced_pod_status("p", ns, {"metadata": {"annotations": {"team.io/x": "1"}}})
    assert core.read_namespaced_pod("p", ns).metadata.annotations["team.io/x"] == "1"


# ---- item 6: Pod Security for gpupack's namespaces ----------------------------------------


def _template_pod(workload: dict[str, Any], namespace: str) -> dict[str, Any]:
    """A workload's pod template as a Pod of ``namespace`` (for a server-side dry run)."""
    tmpl = copy.deepcopy(workload["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{workload['metadata']['name']}-e2e-psa",
                         "namespace": namespace, "labels": tmpl["metadata"].get("labels", {})},
            "spec": tmpl["spec"]}


def test_pod_security_restricts_gpupacks_namespace_and_not_the_agents(
        admin: Any, core: Any) -> None:
    """The chart labels its namespace restricted (Pod Security admission, on by default in
    kube-apiserver) and the node agent's privileged: the scheduler and webhook pods as
    the chart renders them are admitted in gpupack's namespace, the agent's only in its
    own, and a pod on the host's network is refused in gpupack's."""
    from controlplane import AGENT_NAMESPACE, CHART_VALUES, render_chart
    from kubernetes import client

    labels = core.read_namespace(NAMESPACE).metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    assert core.read_namespace(AGENT_NAMESPACE).metadata.labels[
        "pod-security.kubernetes.io/enforce"] == "privileged"
    # The agent's runtime class exists on a GPU cluster (the NVIDIA container runtime).
    node_api = client.NodeV1Api(admin)
    with contextlib.suppress(client.ApiException):
        node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                       "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    objs = render_chart("eA==", CHART_VALUES)
    workloads = {o["metadata"]["name"]: o for o in objs
                 if o.get("kind") in ("Deployment", "DaemonSet")}
    for name in ("gpupack-scheduler", "gpupack-webhook"):
        core.create_namespaced_pod(NAMESPACE, _template_pod(workloads[name], NAMESPACE),
                                   dry_run="All")
    agent = workloads["gpupack-node-agent"]
    misplaced = _template_pod(agent, NAMESPACE)
    misplaced["spec"]["serviceAccountName"] = "default"  # its own account is not there
    body = refused(lambda: core.create_namespaced_pod(NAMESPACE, misplaced, dry_run="All"),
                   "violates PodSecurity")
    assert "hostPID" in body and "hostPath" in body
    core.create_namespaced_pod(AGENT_NAMESPACE, _template_pod(agent, AGENT_NAMESPACE),
                               dry_run="All")
    evil = pod("evil", scheduler=MANUAL_SCHEDULER)
    evil["spec"]["hostNetwork"] = True  # (privileged containers: this API server refuses)
    refused(lambda: core.create_namespaced_pod(NAMESPACE, evil, dry_run="All"),
             "violates PodSecurity")
