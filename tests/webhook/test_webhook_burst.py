"""A burst of pods against mixed free capacity: the webhook counts what it handed out.

The cluster view lags the API server (watch, then a rebuild), so the pods of a burst
all see the same view. Each admission's claim (webhook.claims) and each pending pod of
the snapshot (ClusterView.of) takes its slice or share out of the free counts, so the
burst is spread over the kinds the cluster has instead of piling onto one free slice.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest
from prometheus_client import CollectorRegistry
from webhook_builders import cluster, node, pod, review

from kube.objects import admission_id, pod_request
from packing.model import Snapshot
from webhook.app import create_webhook_app
from webhook.capacity import Claim, ClusterView, ShareKind
from webhook.claims import ClaimBook
from webhook.config import WebhookConfig

MIG_GPU = "nvidia.com/mig-"
SHARED = "nvidia.com/gpu.shared"


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _mixed() -> Snapshot:
    """6 free 3g.40gb and 2 free 7g.80gb on H100s, 24 time-sliced L40S (48Gi, 4 replicas
    each): 32 places for a 30Gi pod, 8 of them MIG."""
    return cluster(
        node("h100-a", mig={"3g.40gb": 6}),
        node("h100-b", mig={"7g.80gb": 2}),
        *(node(f"l40s-{i}", "L40S", 8, "shared") for i in range(3)),
    )


def _resource(p: dict[str, Any]) -> str:
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    (name,) = limits
    return str(name)


def _burst(snapshot: Callable[[], Snapshot], n: int, memory: str, book: ClaimBook,
           clock: Clock | None = None, step_s: float = 0.0) -> list[dict[str, Any]]:
    """``n`` pods through the real app, each pod as the API server would store it."""
    client = create_webhook_app(snapshot, CollectorRegistry(), WebhookConfig(),
                        claim_book=book).test_client()
    out = []
    for i in range(n):
        p = pod(f"asr-{i}", annotations={"gpupack.io/gpu-memory": memory})
        r = client.post("/mutate", data=json.dumps(review(p, uid=f"uid-{i}")),
                        content_type="application/json").get_json()["response"]
        assert r["allowed"] is True, r
        ops = json.loads(base64.b64decode(r["patch"]))
        # A valid RFC 6902 patch of the object the API server sent.
        stored = jsonpatch.JsonPatch(ops).apply(p)
        out.append(stored)
        if clock is not None:
            clock.t += step_s
    return out


def test_thirty_pods_spread_over_mig_and_l40s_shares() -> None:
    snap = _mixed()
    pods = _burst(lambda: snap, 30, "30Gi", ClaimBook())
    got = Counter(_resource(p) for p in pods)
    # Every free MIG slice is taken once, the rest go to L40S shares (one 30Gi per GPU).
    assert got == {"nvidia.com/mig-3g.40gb": 6, "nvidia.com/mig-7g.80gb": 2, SHARED: 22}
    for p in pods:
        decision = json.loads(p["metadata"]["annotations"]["gpupack.io/decision"])
        assert decision["id"].startswith("uid-")
        assert "waits" not in decision["reason"], decision
        products = (p["spec"]["affinity"]["nodeAffinity"]
                    ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                    ["matchExpressions"][0]["values"])
        want = ["NVIDIA-L40S"] if _resource(p) == SHARED else ["NVIDIA-H100-80GB-HBM3"]
        assert products == want


def test_without_claims_the_burst_piles_onto_one_slice() -> None:
    """The failure the claims prevent: once each claim has expired before the next pod,
    every pod sees 6 free 3g.40gb slices and takes one."""
    clock = Clock()
    snap = _mixed()
    pods = _burst(lambda: snap, 30, "30Gi", ClaimBook(ttl_s=1.0, clock=clock), clock, 2.0)
    assert Counter(_resource(p) for p in pods) == {"nvidia.com/mig-3g.40gb": 30}


def test_issue_example_three_pods_one_slice_eight_shares() -> None:
    snap = cluster(node("h100", mig={"3g.40gb": 1}), node("l40s", "L40S", 8, "shared"))
    pods = _burst(lambda: snap, 3, "30Gi", ClaimBook())
    assert [_resource(p) for p in pods] == ["nvidia.com/mig-3g.40gb", SHARED, SHARED]


def test_once_full_the_burst_waits_for_a_slice_that_exists() -> None:
    snap = cluster(node("h100", mig={"3g.40gb": 1}), node("l40s", "L40S", 1, "shared"))
    pods = _burst(lambda: snap, 4, "30Gi", ClaimBook())
    assert [_resource(p) for p in pods] == [
        "nvidia.com/mig-3g.40gb", SHARED, "nvidia.com/mig-3g.40gb", "nvidia.com/mig-3g.40gb"]
    reasons = [json.loads(p["metadata"]["annotations"]["gpupack.io/decision"])["reason"]
               for p in pods]
    assert "waits" in reasons[2] and "waits" in reasons[3]


def test_a_claim_ends_when_the_view_shows_the_pod() -> None:
    """The watch delivers the converted pod: the snapshot counts it as pending, the claim
    is dropped, nothing is counted twice; bound, it stays counted once."""
    nodes = [node("h100", mig={"3g.40gb": 2}), node("l40s", "L40S", 1, "shared")]
    book = ClaimBook()
    current = {"snap": cluster(*nodes)}
    first = _burst(lambda: current["snap"], 1, "30Gi", book)[0]
    assert _resource(first) == "nvidia.com/mig-3g.40gb" and len(book) == 1
    current["snap"] = cluster(*nodes, pods=[first])  # delivered, still pending
    view = ClusterView.of(current["snap"])
    assert view.seen == {"uid-0"}
    assert view.models["H100-80GB"].mig_free["3g.40gb"] == 1
    assert book.live(view.seen) == [] and len(book) == 0
    # The next pod sees the one slice left, then the share.
    client = create_webhook_app(lambda: current["snap"], CollectorRegistry(), WebhookConfig(),
                        claim_book=book).test_client()
    got = []
    for i in (1, 2):
        p = pod(f"asr-{i}", annotations={"gpupack.io/gpu-memory": "30Gi"})
        r = client.post("/mutate", data=json.dumps(review(p, uid=f"uid-{i}")),
                        content_type="application/json").get_json()["response"]
        got.append(_resource(jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["patch"])))))
    assert got == ["nvidia.com/mig-3g.40gb", SHARED]


def test_dry_run_and_reinvocation_claim_nothing() -> None:
    snap = cluster(node("h100", mig={"3g.40gb": 1}), node("l40s", "L40S", 1, "shared"))
    book = ClaimBook()
    client = create_webhook_app(lambda: snap, CollectorRegistry(), WebhookConfig(),
                        claim_book=book).test_client()
    p = pod(annotations={"gpupack.io/gpu-memory": "30Gi"})
    dry = review(p, uid="dry")
    dry["request"]["dryRun"] = True
    assert client.post("/mutate", json=dry).get_json()["response"]["allowed"] is True
    assert len(book) == 0
    r = client.post("/mutate", json=review(p, uid="real")).get_json()["response"]
    stored = jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["patch"])))
    assert len(book) == 1
    again = client.post("/mutate", json=review(stored, uid="reinvoked")).get_json()["response"]
    assert "patch" not in again and len(book) == 1  # the pod keeps its decision and id
    assert admission_id(stored["metadata"]["annotations"]) == "real"


@pytest.mark.parametrize(
    ("pending", "profile_free", "shared_room"),
    [
        # No pending pod: all free.
        ([], 2, {(49152, 1000, 4): 1}),
        # A pending MIG pod takes a free slice of its profile.
        ([{"nvidia.com/mig-3g.40gb": "1"}], 1, {(49152, 1000, 4): 1}),
        # A pending share takes memory and a replica of the tightest shared GPU.
        ([{SHARED: "1"}], 2, {(49152 - 30720, 1000, 3): 1}),
        # Two pending shares of 30Gi: the second does not fit beside the first.
        ([{SHARED: "1"}, {SHARED: "1"}], 2, {(49152 - 30720, 1000, 3): 1}),
        # More pending slices than free ones: nothing left, never negative.
        ([{"nvidia.com/mig-3g.40gb": "1"}] * 3, 0, {(49152, 1000, 4): 1}),
    ],
)
def test_pending_pods_take_free_capacity(pending: list[dict[str, str]], profile_free: int,
                                         shared_room: dict[tuple[int, int, int], int]) -> None:
    pods = [
        pod(f"w{i}", annotations={"gpupack.io/gpu-memory": "30Gi"},
            containers=[{"name": "m", "image": "x", "resources": {"limits": lim}}],
            spec={"schedulerName": "gpupack"})
        for i, lim in enumerate(pending)
    ]
    view = ClusterView.of(cluster(node("h100", mig={"3g.40gb": 2}),
                                  node("l40s", "L40S", 1, "shared"), pods=pods))
    assert view.models["H100-80GB"].mig_free["3g.40gb"] == profile_free
    assert dict(view.models["L40S"].shared_room) == shared_room


@pytest.mark.parametrize(
    ("claims", "free_after"),
    [
        ([Claim(ShareKind.MIG, ("H100-80GB",), 30720, profile="3g.40gb")], 1),
        ([Claim(ShareKind.MIG, ("A100-80GB",), 30720, profile="3g.40gb")], 2),  # other model
        ([Claim(ShareKind.SHARED, ("L40S",), 30720)], 2),  # a share leaves MIG alone
    ],
)
def test_claims_take_only_what_they_name(claims: list[Claim], free_after: int) -> None:
    view = ClusterView.of(cluster(node("h100", mig={"3g.40gb": 2}),
                                  node("l40s", "L40S", 1, "shared")))
    assert view.with_claims(claims).models["H100-80GB"].mig_free["3g.40gb"] == free_after


def test_claim_book_expiry_and_bound() -> None:
    clock = Clock()
    book = ClaimBook(ttl_s=10.0, max_claims=3, clock=clock)
    c = Claim(ShareKind.SHARED, ("L40S",), 1024)
    for i in range(5):
        book.add(f"a{i}", c)
        clock.t += 1.0
    assert len(book) == 3  # the oldest two were dropped
    assert len(book.live({"a3"})) == 2 and len(book) == 2  # seen: counted by the view
    clock.t = 13.5  # a2 was made at 2.0: expired; a4 at 4.0 is not
    assert len(book.live(set())) == 1
    book.add("", c)  # no id, nothing to match it with later: not held
    assert len(book) == 1
    with pytest.raises(ValueError, match="ttl_s"):
        ClaimBook(ttl_s=0)


@pytest.mark.parametrize(
    ("annotation", "want"),
    [
        (None, ""),
        ('{"kind":"mig","profile":"1g.10gb","id":"abc"}', "abc"),
        ('{"kind":"mig","id":7}', ""),
        ("not json with \"id\"", ""),
        ('["id"]', ""),
        ('{"id":"' + "x" * 200 + '"}', ""),
    ],
)
def test_admission_id_from_the_decision(annotation: str | None, want: str) -> None:
    ann = {} if annotation is None else {"gpupack.io/decision": annotation}
    assert admission_id(ann) == want
    p = pod(annotations=ann)
    assert pod_request(p).admission == want


def test_concurrent_reviews_never_share_a_slice() -> None:
    """Reviews arrive on several threads at once (the servers decide on a thread pool):
    deciding and claiming is one step, so no two pods get the same free slice."""
    from concurrent.futures import ThreadPoolExecutor

    snap = _mixed()
    app = create_webhook_app(lambda: snap, CollectorRegistry(), WebhookConfig(),
                             claim_book=ClaimBook())

    def one(i: int) -> str:
        p = pod(f"asr-{i}", annotations={"gpupack.io/gpu-memory": "30Gi"})
        r = app.test_client().post("/mutate", json=review(p, uid=f"u{i}")).get_json()
        ops = json.loads(base64.b64decode(r["response"]["patch"]))
        return _resource(jsonpatch.apply_patch(p, ops))

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = Counter(pool.map(one, range(30)))
    assert got == {"nvidia.com/mig-3g.40gb": 6, "nvidia.com/mig-7g.80gb": 2, SHARED: 22}


def test_serve_shape_counts_claims_on_the_extenders_cache() -> None:
    """``gpupack serve --webhook-port``: the provider is the extender's cache through
    SnapshotFeed, which hands out a new snapshot at most once a second. A burst inside
    that second is spread by the claims; once the cache shows the converted pods
    (pending), their claims end and the pods are counted once."""
    from gpupack.webhook_host import SnapshotFeed
    from kube.cache import ClusterCache

    cache = ClusterCache("gpupack")
    for n in (node("h100", mig={"3g.40gb": 1}), node("l40s", "L40S", 2, "shared")):
        assert cache.upsert_node(n)
    cache.mark_synced()
    feed = SnapshotFeed(cache, min_interval_s=3600.0)  # the view never refreshes by time
    book = ClaimBook()
    client = create_webhook_app(feed, CollectorRegistry(), WebhookConfig(), claim_book=book
                        ).test_client()
    stored = []
    for i in range(3):
        p = pod(f"asr-{i}", annotations={"gpupack.io/gpu-memory": "30Gi"})
        r = client.post("/mutate", json=review(p, uid=f"s{i}")).get_json()["response"]
        stored.append(jsonpatch.apply_patch(p, json.loads(base64.b64decode(r["patch"]))))
    assert [_resource(p) for p in stored] == ["nvidia.com/mig-3g.40gb", SHARED, SHARED]
    assert len(book) == 3
    for p in stored:  # the watch delivers them, unbound
        assert cache.upsert_pod(p)
    view = ClusterView.of(cache.snapshot())
    assert view.seen == {"s0", "s1", "s2"}
    assert view.models["H100-80GB"].mig_free["3g.40gb"] == 0
    assert view.models["L40S"].shared_available(30 * 1024, 0) == 0
    assert book.live(view.seen) == []


def _counts(v: ClusterView) -> tuple[object, ...]:
    return tuple((m.model.name, dict(m.mig_free), dict(m.shared_room), dict(m.mps_room))
                 for m in v.models.values())


def test_claimed_view_equals_taking_every_claim_again() -> None:
    """Incremental (only new claims) and full (all claims) give the same counts, also
    after a claim ends (recomputed) and when the base view changes."""
    from webhook.claims import ClaimedView

    base = ClusterView.of(_mixed())
    other = ClusterView.of(_mixed())
    mig = Claim(ShareKind.MIG, ("H100-80GB",), 30720, profile="3g.40gb")
    share = Claim(ShareKind.SHARED, ("L40S",), 30720)
    steps: list[tuple[ClusterView, list[tuple[str, Claim]]]] = [
        (base, []),
        (base, [("a", mig)]),
        (base, [("a", mig), ("b", share), ("c", mig)]),
        (base, [("b", share), ("c", mig)]),  # "a" ended: recomputed
        (base, [("b", share), ("c", mig), ("d", share)]),
        (other, [("d", share)]),  # a new view
        (other, [("e", mig)]),  # same length, other claims
    ]
    claimed = ClaimedView()
    for view, live in steps:
        got = claimed.get(view, live)
        assert _counts(got) == _counts(view.with_claims(c for _, c in live)), live
