"""Only the nodes a pod can reach count: its node selector, required node affinity and
tolerations (kube.constraints) scope the webhook's capacity view, and a claim made for
one pool leaves another pool's counts alone."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from prometheus_client import CollectorRegistry
from webhook_builders import cluster, node, pod, review

from kube.constraints import NodeLevel, node_level, spec_constraints
from packing.model import Snapshot
from webhook.app import create_webhook_app
from webhook.capacity import SCOPES_KEPT, Claim, ClusterView, ShareKind
from webhook.claims import ClaimBook, ClaimedView
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind

CFG = WebhookConfig()
MEM = "gpupack.io/gpu-memory"
SHARED = "nvidia.com/gpu.shared"
MIG_3G = "nvidia.com/mig-3g.40gb"
AFF = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


def _taint(n: dict[str, Any], key: str, effect: str = "NoSchedule", value: str = ""
           ) -> dict[str, Any]:
    n.setdefault("spec", {}).setdefault("taints", []).append(
        {"key": key, "value": value, "effect": effect})
    return n


def _level(spec: dict[str, Any]) -> NodeLevel:
    return node_level(spec_constraints(spec, "spec"))


def _affinity(*exprs: dict[str, Any], fields: bool = False) -> dict[str, Any]:
    term = {"matchFields" if fields else "matchExpressions": list(exprs)}
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}}


def _expr(key: str, op: str, *values: str) -> dict[str, Any]:
    e: dict[str, Any] = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


# Four GPU nodes: two pools, one tainted, one cordoned.
def _four() -> Snapshot:
    a = node("a", mig={"3g.40gb": 2}, labels={"pool": "a", "rack": "5"})
    b = node("b", mig={"3g.40gb": 2}, labels={"pool": "b", "rack": "20"})
    t = _taint(node("t", mig={"3g.40gb": 2}, labels={"pool": "a"}), "gpu", value="yes")
    c = node("c", mig={"3g.40gb": 2}, labels={"pool": "b"})
    c.setdefault("spec", {})["unschedulable"] = True
    return cluster(a, b, t, c)


FOUR = _four()
TOLERATE_GPU = {"tolerations": [{"key": "gpu", "operator": "Equal", "value": "yes",
                                 "effect": "NoSchedule"}]}
REACH: list[tuple[str, dict[str, Any], set[str]]] = [
    ("no constraints: untainted nodes", {}, {"a", "b", "c"}),
    ("nodeSelector", {"nodeSelector": {"pool": "a"}}, {"a"}),
    ("In", _affinity(_expr("pool", "In", "b")), {"b", "c"}),
    ("NotIn", _affinity(_expr("pool", "NotIn", "b")), {"a"}),
    ("Exists", _affinity(_expr("rack", "Exists")), {"a", "b"}),
    ("DoesNotExist", _affinity(_expr("rack", "DoesNotExist")), {"c"}),
    ("Gt", _affinity(_expr("rack", "Gt", "10")), {"b"}),
    ("Lt", _affinity(_expr("rack", "Lt", "10")), {"a"}),
    ("matchFields", _affinity(_expr("metadata.name", "In", "b", "t"), fields=True), {"b"}),
    ("Equal toleration", TOLERATE_GPU, {"a", "b", "c", "t"}),
    ("Equal toleration, other value", {"tolerations": [{"key": "gpu", "value": "no"}]},
     {"a", "b", "c"}),
    ("Exists toleration", {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
     {"a", "b", "c", "t"}),
    ("empty key Exists tolerates all", {"tolerations": [{"operator": "Exists"}]},
     {"a", "b", "c", "t"}),
    ("toleration of another effect", {"tolerations": [
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"}]}, {"a", "b", "c"}),
    ("selector and toleration", {"nodeSelector": {"pool": "a"}, **TOLERATE_GPU}, {"a", "t"}),
]


@pytest.mark.parametrize(("spec", "nodes"), [r[1:] for r in REACH], ids=[r[0] for r in REACH])
def test_scoped_view_counts_the_nodes_in_reach(spec: dict[str, Any], nodes: set[str]) -> None:
    base = ClusterView.of(FOUR)
    view = base.scoped(_level(spec))
    assert view.reach == nodes
    # Every node has 2 free 3g.40gb; the cordoned one is in reach but offers nothing.
    assert view.models["H100-80GB"].mig_free.get("3g.40gb", 0) == 2 * len(nodes - {"c"})


def test_pool_pod_is_converted_by_its_pools_capacity_only() -> None:
    """The e2e failure: a free slice outside the pod's pool made a pool pod a MIG pod
    where the pool had none left; it must take the pool's share instead."""
    snap = cluster(node("in-mig", mig={"3g.40gb": 1}, labels={"pool": "p"}),
                   node("in-l40s", "L40S", 2, "shared", labels={"pool": "p"}),
                   node("outside", mig={"3g.40gb": 2}, labels={"pool": "other"}))
    client = create_webhook_app(lambda: snap, CollectorRegistry(), CFG,
                        claim_book=ClaimBook()).test_client()

    def admit(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        p = pod(name, annotations={MEM: "30Gi"}, spec=spec)
        r = client.post("/mutate", json=review(p, uid=name)).get_json()["response"]
        assert r["allowed"], r
        out: dict[str, Any] = jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["patch"])))
        return out

    pool = {"nodeSelector": {"pool": "p"}}
    got = [admit(f"p{i}", pool) for i in range(3)]
    limits = [next(iter(p["spec"]["containers"][0]["resources"]["limits"])) for p in got]
    assert limits == [MIG_3G, SHARED, SHARED]
    reason = json.loads(got[0]["metadata"]["annotations"]["gpupack.io/decision"])["reason"]
    assert "1 free on H100-80GB" in reason
    assert "counting the 2 node(s) in reach of spec.nodeSelector.pool=p" in reason
    # A pod without constraints still sees the 2 slices outside the pool.
    free = admit("free", {})
    assert MIG_3G in free["spec"]["containers"][0]["resources"]["limits"]


def _two_pools() -> Snapshot:
    return cluster(node("a-0", mig={"3g.40gb": 2}, labels={"pool": "a"}),
                   node("b-0", mig={"3g.40gb": 2}, labels={"pool": "b"}))


def _free(v: ClusterView) -> int:
    return v.models["H100-80GB"].mig_free.get("3g.40gb", 0)


POOL_A = _level({"nodeSelector": {"pool": "a"}})
POOL_B = _level({"nodeSelector": {"pool": "b"}})


def test_a_claim_in_one_pool_leaves_the_other_alone() -> None:
    base = ClusterView.of(_two_pools())
    d = decide_admission(pod(annotations={MEM: "30Gi"}, spec={"nodeSelector": {"pool": "a"}}),
                         base, CFG)
    assert d.kind is Kind.MIG and d.reach == {"a-0"}
    claim = d.claim()
    assert claim is not None and claim.reach == {"a-0"}
    after = base.with_claims([claim])
    assert (_free(after), _free(after.scoped(POOL_A)), _free(after.scoped(POOL_B))) == (3, 1, 2)
    # A claim that may land in either pool (no constraints) is taken from both: the
    # pod may take either pool's slice.
    anywhere = decide_admission(pod(annotations={MEM: "30Gi"}), base, CFG).claim()
    assert anywhere is not None and anywhere.reach == {"a-0", "b-0"}
    both = after.with_claims([anywhere])
    assert (_free(both), _free(both.scoped(POOL_A)), _free(both.scoped(POOL_B))) == (2, 0, 1)


def test_a_burst_in_one_pool_through_the_app_leaves_the_other_pool_its_slices() -> None:
    snap = _two_pools()
    client = create_webhook_app(lambda: snap, CollectorRegistry(), CFG,
                        claim_book=ClaimBook()).test_client()

    def reason(name: str, pool: str) -> str:
        p = pod(name, annotations={MEM: "30Gi"}, spec={"nodeSelector": {"pool": pool}})
        r = client.post("/mutate", json=review(p, uid=name)).get_json()["response"]
        assert r["allowed"], r
        return str(json.loads(r["auditAnnotations"]["decision"])["reason"])

    assert "2 free" in reason("a0", "a")
    assert "1 free" in reason("a1", "a")
    assert "none free now" in reason("a2", "a")  # pool a is full: it waits
    assert "2 free" in reason("b0", "b")  # pool b untouched by pool a's claims


def test_pending_pods_count_only_in_their_pool() -> None:
    pending = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "w", "namespace": "speech"},
               "spec": {"schedulerName": "gpupack", "nodeSelector": {"pool": "a"},
                        "containers": [{"name": "c", "resources": {
                            "limits": {MIG_3G: "1"}}}]}}
    snap = cluster(node("a-0", mig={"3g.40gb": 2}, labels={"pool": "a"}),
                   node("b-0", mig={"3g.40gb": 2}, labels={"pool": "b"}), pods=[pending])
    base = ClusterView.of(snap)
    assert (_free(base), _free(base.scoped(POOL_A)), _free(base.scoped(POOL_B))) == (3, 1, 2)


@pytest.mark.parametrize(
    ("spec", "kind", "needle"),
    [
        ({"nodeSelector": {"pool": "c"}}, Kind.DENY,
         "spec.nodeSelector.pool=c: no node in reach has a GPU; cannot place "
         "gpupack.io/gpu-memory=30Gi (GPUs out of reach: H100-80GB: "
         "spec.nodeSelector.pool=c"),
        ({}, Kind.DENY, "no node in reach has a GPU; cannot place gpupack.io/gpu-memory=30Gi "
         "(GPUs out of reach: H100-80GB: spec.tolerations (none): taint gpu=yes:NoSchedule)"),
        ({"tolerations": [{"key": "gpu", "operator": "Exists"}]}, Kind.MIG,
         "counting the 1 node(s) in reach of spec.tolerations (1)"),
        (_affinity(_expr("zone", "In", "z1")), Kind.DENY,
         f"{AFF}.nodeSelectorTerms[0].matchExpressions[0] (zone In [z1])"),
    ],
)
def test_reasons_and_denials_name_the_field(spec: dict[str, Any], kind: Kind,
                                            needle: str) -> None:
    snap = cluster(_taint(node("g", mig={"3g.40gb": 1}), "gpu", value="yes"))
    d = decide_admission(pod(annotations={MEM: "30Gi"}, spec=spec), snap, CFG)
    assert d.kind is kind, d.reason
    assert needle in d.reason, d.reason


def test_an_unreadable_constraint_is_a_400_naming_it() -> None:
    spec = _affinity(_expr("pool", "Near", "a"))
    d = decide_admission(pod(annotations={MEM: "30Gi"}, spec=spec), _two_pools(), CFG)
    assert (d.kind, d.status_code) == (Kind.DENY, 400)
    assert f"{AFF}.nodeSelectorTerms[0].matchExpressions[0].operator" in d.reason


def test_scopes_are_cached_per_signature_and_bounded() -> None:
    base = ClusterView.of(_two_pools())
    assert base.scoped(POOL_A) is base.scoped(POOL_A)
    assert base.scoped(_level({})) is base
    # Tolerations of taints no node has change nothing (the API server gives every pod
    # two, DefaultTolerationSeconds): the unconstrained view itself, its fast path.
    default = {"tolerations": [
        {"key": f"node.kubernetes.io/{k}", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300} for k in ("not-ready", "unreachable")]}
    assert base.scoped(_level(default)) is base
    # Constraints that reach the same nodes as none: the same counts (not condensed
    # again), messages naming the pod's fields.
    product = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    same = base.scoped(_level({**product, **default}))
    assert same.models is base.models
    assert same.scope == "spec.nodeSelector.nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"
    for i in range(SCOPES_KEPT + 8):
        base.scoped(_level({"nodeSelector": {"pool": "a", "n": str(i)}}))
    assert len(base._scopes) <= SCOPES_KEPT
    assert base._root is not None and len(base._root.scoped) <= SCOPES_KEPT


def _counts(v: ClusterView) -> tuple[object, ...]:
    return tuple((m.model.name, dict(m.mig_free), dict(m.shared_room), dict(m.mps_room))
                 for m in v.models.values())


def test_scoped_views_follow_claims_incrementally() -> None:
    """What the app does (claims added one by one on the claimed view, a scoped view
    looked up between them) equals scoping the base and taking every live claim again,
    also after a claim ends and the claimed view is rebuilt."""
    base = ClusterView.of(cluster(
        node("a-0", mig={"3g.40gb": 3}, labels={"pool": "a"}),
        node("a-1", "L40S", 2, "shared", labels={"pool": "a"}),
        node("b-0", mig={"3g.40gb": 3}, labels={"pool": "b"})))
    in_a = base.scoped(POOL_A).reach
    mig_a = Claim(ShareKind.MIG, ("H100-80GB",), 30720, profile="3g.40gb", reach=in_a)
    mig_any = Claim(ShareKind.MIG, ("H100-80GB",), 30720, profile="3g.40gb", reach=base.reach)
    share_a = Claim(ShareKind.SHARED, ("L40S",), 30720, reach=in_a)
    mig_b = Claim(ShareKind.MIG, ("H100-80GB",), 30720, profile="3g.40gb",
                  reach=frozenset({"b-0"}))
    steps = [
        [("1", mig_a)],
        [("1", mig_a), ("2", mig_b)],
        [("1", mig_a), ("2", mig_b), ("3", share_a), ("4", mig_any)],
        [("2", mig_b), ("3", share_a), ("4", mig_any)],  # "1" ended: rebuilt
        [("2", mig_b), ("3", share_a), ("4", mig_any), ("5", mig_a)],
    ]
    claimed = ClaimedView()
    for live in steps:
        got = claimed.get(base, live)
        for level in (POOL_A, POOL_B):
            want = base.scoped(level).with_claims(c for _, c in live)
            assert _counts(got.scoped(level)) == _counts(want), (live, level)
    # The last step: each pool of 3 lost its own claim and the one that may land
    # anywhere ("1" ended); the cluster lost all three.
    last = claimed.get(base, steps[-1])
    assert (_free(last), _free(last.scoped(POOL_A)), _free(last.scoped(POOL_B))) == (3, 1, 1)


def test_serve_shape_scopes_on_the_extenders_cache() -> None:
    """``gpupack serve --webhook-port``: nodes, labels and taints come from the
    extender's cache (SnapshotFeed); a pool pod and a pod that does not tolerate a
    taint are converted by what they can reach."""
    from gpupack.webhook_host import SnapshotFeed
    from kube.cache import ClusterCache

    cache = ClusterCache("gpupack")
    for n in (node("in", mig={"3g.40gb": 1}, labels={"pool": "p"}),
              node("l40s", "L40S", 2, "shared", labels={"pool": "p"}),
              _taint(node("tainted", mig={"3g.40gb": 4}), "dedicated", value="llm")):
        assert cache.upsert_node(n)
    cache.mark_synced()
    client = create_webhook_app(SnapshotFeed(cache, min_interval_s=3600.0),
                                CollectorRegistry(), CFG, claim_book=ClaimBook()).test_client()

    def limit(name: str, spec: dict[str, Any]) -> str:
        p = pod(name, annotations={MEM: "30Gi"}, spec=spec)
        r = client.post("/mutate", json=review(p, uid=name)).get_json()["response"]
        assert r["allowed"], r
        stored = jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["patch"])))
        return str(next(iter(stored["spec"]["containers"][0]["resources"]["limits"])))

    pool = {"nodeSelector": {"pool": "p"}}
    assert [limit(f"p{i}", pool) for i in range(2)] == [MIG_3G, SHARED]
    # No toleration: the tainted node's 4 slices are out of reach, the pool's is taken.
    assert limit("plain", {}) == SHARED
    tolerant = {"tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    assert limit("tolerant", tolerant) == MIG_3G


def test_a_rebuilt_view_comes_with_the_scopes_its_predecessor_served() -> None:
    """ViewCache condenses the next snapshot's view in the background, and with it the
    scoped views the previous one served: no review pays for them after a change."""
    import time

    from webhook.app import ViewCache

    views = ViewCache()
    first_snap, second_snap = _two_pools(), _two_pools()
    first = views.get(first_snap)
    first.scoped(POOL_A)
    assert first.levels() == [POOL_A]
    assert views.get(second_snap) is first  # rebuilding in the background
    deadline = time.monotonic() + 10
    while (second := views.get(second_snap)) is first and time.monotonic() < deadline:
        time.sleep(0.01)
    assert second is not first and second.levels() == [POOL_A]
    assert POOL_A in second._scopes  # the review's lookup is a hit
