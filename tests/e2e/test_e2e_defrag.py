"""Defragmentation acting on the real control plane (``--defrag=act``, the chart's
``defrag.mode``): an LLM group waits because a Deployment's small pods sit on the nodes
it needs; gpupack evicts one through the Eviction API, a PodDisruptionBudget holds that
eviction back until it allows it, the Deployment's replacement pod lands elsewhere and
the group lands in the freed room.

Real components: etcd, kube-apiserver, kube-scheduler with the extender, and
kube-controller-manager with the ReplicaSet, Deployment and disruption controllers (the
PDB's ``status.disruptionsAllowed`` is theirs, and so is the replacement pod). There is
no kubelet: ``kubelet_double.KubeletDouble`` does the two things the kubelet would do here, for
this test's namespace only: it reports bound pods Running and Ready (the disruption
controller counts healthy pods by their Ready condition), and it confirms the deletion
of a terminating pod (the evicted pod is only marked for deletion until its kubelet has
stopped it)."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cluster import (
    GPU,
    bound,
    create_nodes,
    create_pods,
    double_bookings,
    group_outcomes,
    h100_whole,
    lws_member,
    overcommits,
    pending_report,
    pod,
    pods_in,
    wait_for,
)
from conftest import Space
from controlplane import SCHEDULER_NAME, Stack, active_replica
from kubelet_double import workloads
from kubernetes import client


def extender_get(stack: Stack, component: str, path: str) -> str:
    """GET ``path`` from an extender's verbs port (loopback; /metrics there is open)."""
    argv = stack.state()["components"][component]["argv"]
    conn = http.client.HTTPConnection("127.0.0.1", int(argv[argv.index("--port") + 1]),
                                      timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def metrics(stack: Stack, admin: Any) -> dict[str, float]:
    """The active extender's gpupack_defrag_* samples."""
    text = extender_get(stack, f"extender{active_replica(stack, admin)}", "/metrics")
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^(gpupack_defrag_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def events_of(core: Any, ns: str, name: str) -> list[str]:
    return [e.reason for e in core.list_namespaced_event(ns).items
            if e.involved_object.name == name and e.source.component == "gpupack-defrag"]


def cordon(core: Any, names: list[str], on: bool) -> None:
    for n in names:
        core.patch_node(n, {"spec": {"unschedulable": on or None}})


def web_pods(core: Any, ns: str) -> list[dict[str, Any]]:
    return [p for p in pods_in(core, ns) if p["metadata"].get("labels", {}).get("app") == "web"
            and not p["metadata"].get("deletionTimestamp")]


def web_on(core: Any, apps: Any, ns: str, pool: str, first: str, second: str,
           others: list[str]) -> dict[str, str]:
    """A Deployment "web" of two 2-GPU pods, one on ``first`` and one on ``second``
    (cordons steer them: gpupack would pack both on one node); pod name -> node."""
    template = pod("web", limits={GPU: "2"}, pool=pool, scheduler=SCHEDULER_NAME,
                   labels={"app": "web"})
    cordon(core, [second, *others], True)
    apps.create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": template["spec"]}}})
    wait_for(lambda: [q for q in web_pods(core, ns) if q["spec"].get("nodeName") == first],
             60, "the first web pod (a ReplicaSet made by the Deployment controller)")
    cordon(core, [first], True)
    cordon(core, [second], False)
    apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 2}})
    wait_for(lambda: [q for q in web_pods(core, ns) if q["spec"].get("nodeName") == second],
             60, "the second web pod")
    cordon(core, [first, *others], False)
    where = {q["metadata"]["name"]: q["spec"]["nodeName"] for q in web_pods(core, ns)}
    assert sorted(where.values()) == sorted([first, second]), where
    return where


def pdb_status(policy: Any, ns: str) -> Any:
    return policy.read_namespaced_pod_disruption_budget("web", ns).status


def test_pdb_holds_the_eviction_then_the_replacement_moves_and_the_group_lands(
        stack: Stack, space: Space, core: Any, admin: Any, kcm: None) -> None:
    ns = space.namespace()
    p = space.name
    apps, policy = client.AppsV1Api(admin), client.PolicyV1Api(admin)
    a, b, c = f"{p}-a", f"{p}-b", f"{p}-c"
    space.nodes += create_nodes(core, [h100_whole(n, p) for n in (a, b, c)])
    with workloads(core, admin, ns):
        _scenario(stack, core, admin, apps, policy, ns, p, a, b, c)


def _scenario(stack: Stack, core: Any, admin: Any, apps: Any, policy: Any, ns: str, p: str,
              a: str, b: str, c: str) -> None:
    # A Deployment of two 2-GPU pods, one on a and one on b; c is empty. Then a group of
    # 2 x 8 GPUs needs two whole nodes: only c is.
    before = web_on(core, apps, ns, p, a, b, [c])
    policy.create_namespaced_pod_disruption_budget(ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "web"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "web"}}}})
    wait_for(lambda: (lambda s: s is not None and s.expected_pods == 2 and
                      s.current_healthy == 2 and s.disruptions_allowed == 0)(
        pdb_status(policy, ns)), 60, "the disruption controller's status of the budget")

    # The group: both members at once, no room for them together.
    m0 = metrics(stack, admin)
    waiting_since = time.monotonic()
    create_pods(core, ns, [lws_member("llm", w, 2, 8, p) for w in range(2)])

    # The budget refuses: 429 from the Eviction API, tried again with backoff; nothing
    # evicted meanwhile.
    def refused(n: int) -> Any:
        got = metrics(stack, admin)
        k = 'gpupack_defrag_evictions_total{outcome="pdb"}'
        return got if got.get(k, 0) - m0.get(k, 0) >= n else None

    wait_for(lambda: refused(2), 90, "two evictions refused by the PodDisruptionBudget")
    assert {q["metadata"]["name"]: q["spec"]["nodeName"] for q in web_pods(core, ns)} == before
    assert not bound(pods_in(core, ns)).keys() & {"llm-0", "llm-0-1"}
    assert "DefragEvictionRefused" in events_of(core, ns, "llm-0")
    assert "DefragStarted" in events_of(core, ns, "llm-0")
    blocked_s = time.monotonic() - waiting_since

    # The budget allows one disruption now: the eviction goes through.
    policy.patch_namespaced_pod_disruption_budget("web", ns, {"spec": {"minAvailable": 1}})
    allowed_at = time.monotonic()

    def group_bound() -> Any:
        pods = pods_in(core, ns)
        return pods if {"llm-0", "llm-0-1"} <= bound(pods).keys() else None

    try:
        pods = wait_for(group_bound, 120, "the group's two members bound")
    except AssertionError:
        raise AssertionError(pending_report(core, ns)) from None
    placed_s = time.monotonic() - waiting_since
    group = group_outcomes(core, pods)["llm"]
    freed = next(n for n in (a, b) if n in group.nodes)
    assert sorted(group.nodes) == sorted([freed, c]), group.nodes
    # The evicted web pod is gone; its replacement (a new pod of the ReplicaSet) runs on
    # the node that kept its web pod, never in the room freed for the group.
    evicted = next(name for name, node in before.items() if node == freed)
    kept = next(name for name, node in before.items() if node != freed)
    web = wait_for(lambda: (lambda ws: ws if len(bound(ws)) == 2 else None)(
        web_pods(core, ns)), 60, "the Deployment's replacement pod bound")
    now = bound(web)
    assert evicted not in now and now[kept] == before[kept], now
    replacement = next(name for name in now if name != kept)
    assert now[replacement] != freed and now[replacement] != c, now
    owner = next(q for q in web if q["metadata"]["name"] == replacement)["metadata"]
    assert owner["ownerReferences"][0]["kind"] == "ReplicaSet"
    assert overcommits(core, pods_in(core, ns)) == []
    assert double_bookings(pods_in(core, ns)) == []
    assert "EvictedForGroup" in events_of(core, ns, evicted)
    wait_for(lambda: "DefragRoomReserved" in events_of(core, ns, "llm-0"), 10,
             "the group's DefragRoomReserved event")
    handed_k = 'gpupack_defrag_campaigns_stopped_total{reason="handed_over"}'
    m1 = wait_for(lambda: (lambda m: m if m.get(handed_k, 0) > m0.get(handed_k, 0) else None)(
        metrics(stack, admin)), 10, "the campaign reported handed over")

    def delta(k: str) -> float:
        return m1.get(k, 0) - m0.get(k, 0)

    assert delta('gpupack_defrag_evictions_total{outcome="evicted"}') == 1
    assert delta("gpupack_defrag_gpus_freed_total") == 2
    assert delta("gpupack_defrag_group_wait_seconds_count") == 1
    assert delta(handed_k) == 1
    pdb_k = 'gpupack_defrag_evictions_total{outcome="pdb"}'
    done_k = 'gpupack_defrag_evictions_total{outcome="evicted"}'
    print(f"\ndefrag e2e: group waiting -> placed {placed_s:.1f} s (blocked by the PDB "
          f"{blocked_s:.1f} s, placed {time.monotonic() - allowed_at:.1f} s after it allowed "
          f"the eviction); evictions refused (pdb) {delta(pdb_k):.0f}, done "
          f"{delta(done_k):.0f}; GPUs freed {delta('gpupack_defrag_gpus_freed_total'):.0f}; "
          f"wait histogram sum {delta('gpupack_defrag_group_wait_seconds_sum'):.1f} s")


@pytest.fixture
def consolidating(stack: Stack, admin: Any) -> Iterator[None]:
    """The active extender restarted with a consolidation window open all day (and
    plans every 2 s), and restarted as the chart runs it afterwards."""
    component = f"extender{active_replica(stack, admin)}"
    state = stack.state()
    argv = list(state["components"][component]["argv"])
    state["components"][component]["argv"] = [
        *argv, "--defrag-consolidate", "00:00-24:00", "--defrag-interval", "2"]
    stack.save(state)
    stack.restart(component)
    try:
        yield
    finally:
        state = stack.state()
        state["components"][component]["argv"] = argv
        stack.save(state)
        stack.restart(component)
        _watching(stack, component, admin)


def _watching(stack: Stack, component: str, admin: Any) -> None:
    """Until the restarted extender's watch delivers: a probe Node created now shows in
    its cache (right after a start its watch can lag the list by a second, and the next
    test creates its nodes and pods at once)."""
    core = client.CoreV1Api(admin)
    name = f"defrag-probe-{int(time.time())}"
    create_nodes(core, [h100_whole(name, "defrag-probe")])
    try:
        base = len(core.list_node().items)
        wait_for(lambda: json.loads(extender_get(stack, component, "/readyz")).get(
            "nodes", 0) >= base, 30,
                 "the restarted extender to see a new Node through its watch")
    finally:
        core.delete_node(name)


def test_consolidation_keeps_whole_nodes_free_for_the_groups_seen(
        stack: Stack, space: Space, core: Any, admin: Any, kcm: None, consolidating: None
) -> None:
    ns = space.namespace()
    p = space.name
    apps = client.AppsV1Api(admin)
    a, b, c, d = (f"{p}-{x}" for x in "abcd")
    space.nodes += create_nodes(core, [h100_whole(n, p) for n in (a, b, c, d)])
    with workloads(core, admin, ns):
        _consolidation(stack, core, admin, apps, ns, p, a, b, c, d)


def _consolidation(stack: Stack, core: Any, admin: Any, apps: Any, ns: str, p: str, a: str,
                   b: str, c: str, d: str) -> None:
    # One 2-GPU web pod on a and one on b, c and d empty.
    m0 = metrics(stack, admin)
    before = web_on(core, apps, ns, p, a, b, [c, d])
    # A group of 2 x 8 GPUs lands on c and d at once (no eviction needed): now no whole
    # node is free for the next one of its size.
    create_pods(core, ns, [lws_member("llm", w, 2, 8, p) for w in range(2)])
    pods = wait_for(lambda: (lambda ps: ps if {"llm-0", "llm-0-1"} <= bound(ps).keys()
                             else None)(pods_in(core, ns)), 60, "the group bound")
    assert sorted(group_outcomes(core, pods)["llm"].nodes) == sorted([c, d])
    started = time.monotonic()

    # Consolidation empties a or b: one web pod evicted, its replacement beside the other.
    def consolidated() -> Any:
        web = web_pods(core, ns)
        where = bound(web)
        return where if len(where) == 2 and len(set(where.values())) == 1 else None

    where = wait_for(consolidated, 90, "both web pods on one node")
    took_s = time.monotonic() - started
    kept_node = next(iter(set(where.values())))
    assert kept_node in (a, b)
    freed = b if kept_node == a else a
    evicted = next(name for name, node in before.items() if node == freed)
    assert evicted not in where
    assert not [q for q in pods_in(core, ns) if q["spec"].get("nodeName") == freed]
    assert "EvictedForConsolidation" in events_of(core, ns, evicted)
    assert overcommits(core, pods_in(core, ns)) == []
    done_k = 'gpupack_defrag_campaigns_stopped_total{reason="consolidated"}'
    m1 = wait_for(lambda: (lambda m: m if m.get(done_k, 0) > m0.get(done_k, 0) else None)(
        metrics(stack, admin)), 10, "the consolidation reported")
    evicted_k = 'gpupack_defrag_evictions_total{outcome="evicted"}'
    assert m1.get(evicted_k, 0) - m0.get(evicted_k, 0) == 1
    # Nothing more to do: the kept node's two pods have nowhere else to go.
    time.sleep(8)
    assert bound(web_pods(core, ns)) == where
    print(f"\ndefrag e2e consolidation: {freed} emptied {took_s:.1f} s after the group "
          f"landed, 1 eviction")
