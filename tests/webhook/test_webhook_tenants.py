"""Forged AdmissionReviews from one tenant change nothing for another (issue 35 item 1).

Anyone who reaches the webhook's port may post a review (unless the webhook verifies the
API server's client certificate, tests/webhook/test_webhook_client_auth.py). Each review
with a new uid used to claim a slice or share for 30 s, from a book shared by every
namespace: 8 forged reviews for pods of ``evil`` moved a victim's pod from a MIG slice
to a time-sliced share, 24 told it to wait. A claim now counts only for pods of the
namespace its review named (webhook.claim_scope), the book is bounded per namespace,
and a claim ends once another pod holds its pod's name.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from webhook_builders import cluster, node, pod, review

from packing.model import Snapshot
from webhook.app import create_webhook_app
from webhook.capacity import Claim, ShareKind
from webhook.claims import ClaimBook
from webhook.config import WebhookConfig

VICTIM_NS = "speech"


def _issue_cluster() -> Snapshot:
    """The issue's pool: 8 free 3g.40gb slices, 12 time-sliced L40S shares of 48Gi."""
    return cluster(node("h100-a", mig={"3g.40gb": 4}), node("h100-b", mig={"3g.40gb": 4}),
                   node("l40s-0", "L40S", 3, "shared"))


class Hook:
    """The real app over one snapshot, and a book we can look into."""

    def __init__(self, snapshot: Snapshot, book: ClaimBook | None = None) -> None:
        self.book = book if book is not None else ClaimBook()
        self.client = create_webhook_app(lambda: snapshot, CollectorRegistry(),
                                         WebhookConfig(), claim_book=self.book).test_client()
        self.n = 0

    def post(self, obj: dict[str, Any], namespace: str, uid: str | None = None,
             dry_run: bool = False) -> dict[str, Any]:
        self.n += 1
        r = review(obj, uid=uid or f"u{self.n}", namespace=namespace)
        r["request"]["dryRun"] = dry_run
        out = self.client.post("/mutate", json=r).get_json()["response"]
        assert isinstance(out, dict)
        return out

    def decision(self, memory: str = "30Gi", isolation: str = "any") -> tuple[str, str]:
        """The victim's server-side dry run: (resource, reason) it would be given."""
        obj = pod("victim", annotations={"gpupack.io/gpu-memory": memory,
                                         "gpupack.io/isolation": isolation},
                  namespace=VICTIM_NS)
        r = self.post(obj, VICTIM_NS, dry_run=True)
        if not r["allowed"]:
            return "denied", r["status"]["message"]
        stored = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(r["patch"])))
        (resource,) = stored["spec"]["containers"][0]["resources"]["limits"]
        return resource, json.loads(stored["metadata"]["annotations"]
                                    ["gpupack.io/decision"])["reason"]


def _forged(hook: Hook, n: int, namespace: str, memory: str = "30Gi", tag: str = "f"
            ) -> None:
    for i in range(n):
        obj = pod(f"{tag}{i}", annotations={"gpupack.io/gpu-memory": memory},
                  namespace=namespace)
        assert hook.post(obj, namespace, uid=f"{tag}-{namespace}-{i}")["allowed"]


def test_issue_attack_eight_and_twenty_four_forged_reviews_change_nothing() -> None:
    snap = _issue_cluster()
    hook = Hook(snap)
    before = hook.decision()
    assert before[0] == "nvidia.com/mig-3g.40gb"
    _forged(hook, 8, "evil")
    assert hook.decision() == before
    _forged(hook, 16, "evil", tag="g")
    assert len(hook.book) == 24  # the claims are held: they count for evil's own pods
    assert hook.decision() == before


def test_the_same_reviews_naming_the_victims_namespace_do_count() -> None:
    """The control: the claims are live and do what they are for inside a namespace (a
    burst of one workload is spread over the kinds the cluster has)."""
    hook = Hook(_issue_cluster())
    _forged(hook, 8, VICTIM_NS)
    assert hook.decision()[0] == "nvidia.com/gpu.shared"
    _forged(hook, 16, VICTIM_NS, tag="g")
    resource, reason = hook.decision()
    assert resource == "nvidia.com/mig-3g.40gb" and "waits" in reason


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["evil", "other", "kube-public"]),
                          st.sampled_from(["1Gi", "10Gi", "30Gi", "40Gi", "70Gi"])),
                max_size=40),
       st.sampled_from(["8Gi", "30Gi", "60Gi"]), st.sampled_from(["any", "mig", "shared"]))
def test_any_reviews_of_other_namespaces_leave_the_victims_decision_as_without_them(
        reviews: list[tuple[str, str]], memory: str, isolation: str) -> None:
    snap = _issue_cluster()
    baseline = Hook(snap).decision(memory, isolation)
    hook = Hook(snap)
    for i, (ns, mem) in enumerate(reviews):
        hook.post(pod(f"p{i}", annotations={"gpupack.io/gpu-memory": mem}, namespace=ns), ns)
    assert hook.decision(memory, isolation) == baseline


def test_a_flood_in_one_namespace_cannot_push_out_anothers_claims() -> None:
    c = Claim(ShareKind.SHARED, ("L40S",), 1024)
    book = ClaimBook(max_claims=10, max_per_namespace=6)
    for i in range(3):
        book.add(f"s{i}", c, namespace=VICTIM_NS)
    for i in range(50):
        book.add(f"e{i}", c, namespace="evil")
    # evil holds its own bound at most, and the whole book's cap took from evil only.
    assert [k for k, _ in book.live_items(set(), VICTIM_NS)] == ["s0", "s1", "s2"]
    assert [k for k, _ in book.live_items(set(), "evil")] == [f"e{i}" for i in range(44, 50)]
    assert len(book) == 9 and book.pushed_out == 44
    # A second flooding namespace shares the cap with evil; the victim keeps its three.
    for i in range(50):
        book.add(f"x{i}", c, namespace="evil2")
    assert len(book.live_items(set(), VICTIM_NS)) == 3 and len(book) == 10


def test_a_repeated_uid_in_another_namespace_neither_replaces_nor_replays() -> None:
    """The API server retries a call with the same uid and gets the same answer; a review
    of another namespace reusing that uid is another admission altogether."""
    snap = cluster(node("h100", mig={"3g.40gb": 1}), node("l40s", "L40S", 1, "shared"))
    hook = Hook(snap)
    mine = pod("asr", annotations={"gpupack.io/gpu-memory": "30Gi"}, namespace=VICTIM_NS)
    first = hook.post(mine, VICTIM_NS, uid="same")
    assert hook.post(mine, VICTIM_NS, uid="same") == first  # a retry: same answer
    theirs = pod("x", annotations={"gpupack.io/gpu-memory": "30Gi"}, namespace="evil")
    hook.post(theirs, "evil", uid="same")
    assert sorted(k for k, _ in hook.book.live_items(set())) == ["same", "same"]
    assert hook.post(mine, VICTIM_NS, uid="same") == first


def test_a_claim_ends_when_another_pod_holds_its_name() -> None:
    """A create under a name the cluster already has fails (AlreadyExists): its claim
    can no longer be taken by a pod, so it ends with the next view."""
    nodes = [node("h100", mig={"3g.40gb": 1}), node("l40s", "L40S", 1, "shared")]
    existing = pod("asr", namespace=VICTIM_NS, spec={"schedulerName": "gpupack"},
                   containers=[{"name": "m", "image": "x",
                                "resources": {"limits": {"cpu": "1"}}}])
    snap = cluster(*nodes, pods=[existing])
    hook = Hook(snap)
    forged = pod("asr", annotations={"gpupack.io/gpu-memory": "30Gi"}, namespace=VICTIM_NS)
    assert hook.post(forged, VICTIM_NS, uid="forged")["allowed"]
    generated = pod("", annotations={"gpupack.io/gpu-memory": "30Gi"}, namespace=VICTIM_NS)
    del generated["metadata"]["name"]
    generated["metadata"]["generateName"] = "asr-"
    assert hook.post(generated, VICTIM_NS, uid="gen")["allowed"]
    # The forged claim ended (its name is taken); the generated one holds the slice.
    assert [k for k, _ in hook.book.live_items(set(), VICTIM_NS)] == ["gen"]
