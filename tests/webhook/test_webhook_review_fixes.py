"""Defects found in review: init containers and sidecars, spec.nodeName, copied decisions,
claims of explicit pods, busy explicit profiles, retried reviews, shell scripts and
empty node selector terms."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import celpy
import jsonpatch
import pytest
import yaml
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry
from webhook_builders import cluster, node, pod, review

from kube.constraints import spec_node_level
from kube.objects import admission_id, pod_request
from packing.constraints import exclusion
from packing.model import RequestKind, Snapshot
from webhook.app import create_webhook_app
from webhook.capacity import Claim, ClusterView, ShareKind
from webhook.claims import ClaimBook, ClaimedView
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import Kind
from webhook.sizing import _shell

H100 = "NVIDIA-H100-80GB-HBM3"
MIG_1G = "nvidia.com/mig-1g.10gb"
REQ = "requiredDuringSchedulingIgnoredDuringExecution"
ROOT = Path(__file__).resolve().parents[2]


def _client(snap: Snapshot, book: ClaimBook) -> FlaskClient:
    return create_webhook_app(lambda: snap, CollectorRegistry(), WebhookConfig(),
                              claim_book=book).test_client()


def _answer(c: FlaskClient, obj: dict[str, Any], uid: str) -> dict[str, Any]:
    r = c.post("/mutate", data=json.dumps(review(obj, uid=uid)),
               content_type="application/json")
    assert r.status_code == 200, r.get_data()
    out: dict[str, Any] = r.get_json()["response"]
    return out


def _apply(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    if "patch" not in response:
        return obj
    ops = json.loads(base64.b64decode(response["patch"]))
    out: dict[str, Any] = jsonpatch.JsonPatch(ops).apply(obj)
    return out


def _limits(p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return out


def _one_slice() -> Snapshot:
    """Exactly one free 1g.10gb; time-sliced L40S room besides."""
    return cluster(node("h100-0", gpus=1, mig={"1g.10gb": 1}),
                   node("l40s-0", "L40S", 4, "shared"))


def _explicit_mig(name: str = "p", annotations: dict[str, str] | None = None
                  ) -> dict[str, Any]:
    return pod(name, annotations=annotations, containers=[{
        "name": "m", "image": "x",
        "resources": {"limits": {MIG_1G: "1"}, "requests": {MIG_1G: "1"}}}])


SIZED = {"gpupack.io/gpu-memory": "8Gi"}


# ---- 1. init containers and sidecars ----------------------------------------------------------


def _init(resources: dict[str, Any], sidecar: bool = False) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "side" if sidecar else "init", "image": "x",
                         "resources": resources}
    if sidecar:
        c["restartPolicy"] = "Always"
    return {"initContainers": [c]}


@pytest.mark.parametrize(("annotations", "spec", "kind", "field"), [
    # A sized pod with a GPU in an init container or a sidecar: denied, naming the field.
    (SIZED, _init({"limits": {"nvidia.com/gpu": "1"}}), Kind.DENY,
     "spec.initContainers[0].resources.limits.nvidia.com/gpu=1 asks for a GPU in an init"),
    (SIZED, _init({"requests": {MIG_1G: "1"}}, sidecar=True), Kind.DENY,
     f"spec.initContainers[0].resources.requests.{MIG_1G}=1 asks for a GPU in a sidecar"),
    ({"gpupack.io/class": "asr"}, _init({"limits": {"nvidia.com/gpu.shared": "1"}}),
     Kind.DENY, "spec.initContainers[0].resources.limits.nvidia.com/gpu.shared"),
    # Without gpupack annotations: classified by every container, as the extender reads it.
    ({}, _init({"limits": {"nvidia.com/gpu": "1"}}), Kind.WHOLE, ""),
    ({}, _init({"limits": {MIG_1G: "1"}}, sidecar=True), Kind.EXPLICIT, ""),
    # An init container without a GPU changes nothing.
    (SIZED, _init({"limits": {"cpu": "1"}}), Kind.MIG, ""),
])
def test_init_containers_and_sidecars(annotations: dict[str, str], spec: dict[str, Any],
                                      kind: Kind, field: str) -> None:
    p = pod(annotations=annotations or None, spec=spec)
    d = decide_admission(p, _one_slice(), WebhookConfig())
    assert d.kind is kind, d.reason
    if kind is Kind.DENY:
        assert d.status_code == 400 and d.reason.startswith(field), d.reason
    if kind is Kind.WHOLE:
        assert pod_request(p).kind is RequestKind.WHOLE  # what the extender reads


def _cel(expression: str, obj: dict[str, Any]) -> bool:
    env = celpy.Environment()
    return bool(env.program(env.compile(expression)).evaluate(
        {"object": celpy.json_to_cel(obj)}))


@pytest.mark.parametrize("source", ["base", "helm"])
def test_match_conditions_see_init_container_gpus(source: str) -> None:
    if source == "base":
        docs = list(yaml.safe_load_all((ROOT / "manifests/base/webhook.yaml").read_text()))
        mwc = next(d for d in docs if d and d.get("kind") == "MutatingWebhookConfiguration")
        hooks = {w["name"]: w["matchConditions"][0]["expression"] for w in mwc["webhooks"]}
        gpu, other = hooks["gpu-pods.gpupack.io"], hooks["opted-in.gpupack.io"]
    else:
        text = (ROOT / "manifests/helm/gpupack/templates/_helpers.tpl").read_text()
        body = text.split('{{- define "gpupack.gpuPodCEL" -}}', 1)[1].split("{{- end -}}")[0]
        gpu, other = body, f"!({body})"
    init_only = pod(spec=_init({"limits": {"nvidia.com/gpu": "1"}}))
    plain_init = pod(spec=_init({"limits": {"cpu": "1"}}))
    assert _cel(gpu, init_only) and not _cel(other, init_only)
    assert not _cel(gpu, plain_init) and _cel(other, plain_init)


# ---- 2. spec.nodeName -------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "kind", "resource"), [
    ({"nodeName": "l40s-0"}, Kind.SHARED, "nvidia.com/gpu.shared"),
    ({"nodeName": "h100-0"}, Kind.MIG, MIG_1G),
    # An empty term stays empty (matches nothing); the other term gets the pin.
    ({"nodeName": "l40s-0", "affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
        {}, {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}]}}}},
     Kind.SHARED, "nvidia.com/gpu.shared"),
    ({"nodeName": "gone"}, Kind.DENY, None),
])
def test_node_name_pins_the_pod_to_its_node(spec: dict[str, Any], kind: Kind,
                                            resource: str | None) -> None:
    snap = cluster(node("h100-0", mig={"1g.10gb": 7}), node("l40s-0", "L40S", 4, "shared"))
    d = decide_admission(pod(annotations=SIZED, spec=spec), snap, WebhookConfig())
    assert d.kind is kind and d.resource == resource, d.reason
    assert f"spec.nodeName={spec['nodeName']}" in d.reason


def test_node_name_that_cannot_be_read_is_a_400() -> None:
    d = decide_admission(pod(annotations=SIZED, spec={"nodeName": 5}), _one_slice(),
                         WebhookConfig())
    assert d.status_code == 400 and d.reason.startswith("spec.nodeName: expected a string")


# ---- 3. a decision copied from a running pod ----------------------------------------------------


def _copied(name: str) -> dict[str, Any]:
    doc = {"kind": "mig", "profile": "1g.10gb", "model": "H100-80GB", "products": [H100],
           "reason": "smallest MIG slice holding 8Gi; 1 free on H100-80GB", "id": "old-uid"}
    p = _explicit_mig(name, {**SIZED, "gpupack.io/decision": json.dumps(doc)})
    p["spec"]["affinity"] = {"nodeAffinity": {REQ: {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}]}]}}}
    return p


def test_copied_decision_is_claimed_under_the_new_review() -> None:
    book = ClaimBook()
    c = _client(_one_slice(), book)
    stored = _apply(_copied("copy-0"), _answer(c, _copied("copy-0"), "new-0"))
    assert _limits(stored) == {MIG_1G: "1"}
    assert [k for k, _ in book.live_items(set())] == ["new-0"]
    assert admission_id(stored["metadata"]["annotations"]) == "new-0"  # ends when seen
    fresh = pod("fresh", annotations=SIZED)
    assert MIG_1G not in _limits(_apply(fresh, _answer(c, fresh, "new-1")))
    # Its re-invocation (the id is a live claim) keeps it: no patch, no second claim.
    again = _answer(c, stored, "new-2")
    assert again["allowed"] and "patch" not in again
    assert len(book) == 2


# ---- 4. explicit pods are claimed ---------------------------------------------------------------


def test_explicit_pods_are_claimed_until_the_view_shows_them() -> None:
    book = ClaimBook()
    c = _client(_one_slice(), book)
    explicit = _explicit_mig("explicit")
    stored = _apply(explicit, _answer(c, explicit, "e1"))
    assert _limits(stored) == {MIG_1G: "1"}
    assert json.loads(stored["metadata"]["annotations"]["gpupack.io/decision"]) == {
        "kind": "explicit", "resource": MIG_1G, "id": "e1"}
    assert admission_id(stored["metadata"]["annotations"]) == "e1"
    (held,) = book.live([])
    assert (held.kind, held.profile, held.memory_mib) == (ShareKind.MIG, "1g.10gb", 0)
    fresh = pod("fresh", annotations=SIZED)
    assert MIG_1G not in _limits(_apply(fresh, _answer(c, fresh, "e2")))
    # Re-invoked, the explicit pod records nothing new and its patch is empty.
    assert "patch" not in _answer(c, stored, "e3")
    assert len(book) == 2
    assert [k for k, _ in book.live_items({"e1"})] == ["e2"]  # seen: the claim ends


@pytest.mark.parametrize(("resources", "claimed"), [
    ({"limits": {"nvidia.com/gpu.shared": "1"}}, ShareKind.SHARE),
    ({"limits": {MIG_1G: "0"}}, None),  # asks for no device
    ({"limits": {MIG_1G: "1", "nvidia.com/mig-2g.20gb": "1"}}, None),  # the extender refuses
])
def test_explicit_claims(resources: dict[str, Any], claimed: ShareKind | None) -> None:
    p = pod(containers=[{"name": "m", "image": "x", "resources": resources}])
    d = decide_admission(p, _one_slice(), WebhookConfig())
    assert d.kind is Kind.EXPLICIT
    claim = d.claim()
    assert (claim.kind if claim else None) is claimed


# ---- 5. an explicit profile that is busy now --------------------------------------------------


@pytest.mark.parametrize(("profile", "taken", "allowed", "reason"), [
    # Replicas of one manifest: the smallest slice is busy, the pod waits for one.
    ("1g.10gb", 1, True, "none free now on H100-80GB, the pod waits for one"),
    ("1g.10gb", 0, True, "1 free"),
    # A larger slice that is free while the smallest is busy is still kept.
    ("2g.20gb", 1, True, "2 free"),
    # A larger slice while the smallest is free is still a contradiction.
    ("2g.20gb", 0, False, "conflicts with gpupack.io/gpu-memory=8Gi (it needs "
                          "nvidia.com/mig-1g.10gb on H100-80GB)"),
])
def test_explicit_profile_kept_when_busy(profile: str, taken: int, allowed: bool,
                                         reason: str) -> None:
    snap = cluster(node("h100-0", gpus=1, mig={"1g.10gb": 1, "2g.20gb": 2}))
    view = ClusterView.of(snap).with_claims(
        [Claim(ShareKind.MIG, ("H100-80GB",), 0, profile="1g.10gb")] * taken)
    res = f"nvidia.com/mig-{profile}"
    p = pod(annotations=SIZED, containers=[{"name": "m", "image": "x",
                                            "resources": {"limits": {res: "1"}}}])
    d = decide_admission(p, view, WebhookConfig())
    assert d.allowed is allowed and reason in d.reason, d.reason
    if allowed:
        assert d.resource == res


# ---- 6. a retried review ---------------------------------------------------------------------


def test_retried_review_gets_the_same_answer_and_one_claim() -> None:
    snap = cluster(node("h100-0", gpus=1, mig={"1g.10gb": 1, "2g.20gb": 1}),
                   node("l40s-0", "L40S", 4, "shared"))
    book = ClaimBook()
    c = _client(snap, book)
    p = pod("a", annotations=SIZED)
    first, again = _answer(c, p, "same"), _answer(c, p, "same")
    assert first == again and MIG_1G in _limits(_apply(p, first))
    assert len(book) == 1
    # Another pod under a reused uid is decided afresh (not handed the first answer).
    q = pod("b", annotations=SIZED)
    assert "nvidia.com/mig-2g.20gb" in _limits(_apply(q, _answer(c, q, "same")))


def test_claimed_view_follows_a_replaced_claim() -> None:
    base = ClusterView.of(cluster(node("h100-0", gpus=1, mig={"1g.10gb": 1, "2g.20gb": 1})))
    one = Claim(ShareKind.MIG, ("H100-80GB",), 0, profile="1g.10gb")
    two = Claim(ShareKind.MIG, ("H100-80GB",), 0, profile="2g.20gb")
    cv = ClaimedView()
    assert cv.get(base, [("u", one)]).models["H100-80GB"].mig_free.get("1g.10gb", 0) == 0
    free = cv.get(base, [("u", two)]).models["H100-80GB"].mig_free
    assert (free.get("1g.10gb", 0), free.get("2g.20gb", 0)) == (1, 0)


# ---- 7. shells ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("command", "args", "shell"), [
    (["sh", "-c", "vllm serve m"], None, True),
    (["/bin/bash", "-ec", "vllm serve m"], None, True),
    (["/usr/bin/bash", "-c", "vllm serve m"], None, True),
    (["/bin/sh"], ["-xc", "vllm serve m"], True),
    (["/usr/bin/env", "bash", "-lc", "vllm serve m"], None, True),
    (["bash", "-e", "-c", "vllm serve m"], None, True),
    (["bash", "run.sh"], None, False),
    (["vllm", "serve", "m", "--chat-template", "c"], None, False),
    (["bash", "--norc", "run.sh"], None, False),
])
def test_shell_detection(command: list[str], args: list[str] | None, shell: bool) -> None:
    c: dict[str, Any] = {"name": "s", "command": command}
    if args is not None:
        c["args"] = args
    assert _shell(c) is shell


@pytest.mark.parametrize("strict", [False, True])
def test_set_fraction_never_appends_after_a_script(strict: bool) -> None:
    ann = {"gpupack.io/gpu-memory": "12Gi", "gpupack.io/memory-fraction": "set"}
    if strict:
        ann["gpupack.io/strict"] = "true"
    p = pod(annotations=ann, containers=[{"name": "srv", "image": "registry/x",
                                          "command": ["/bin/bash", "-ec", "vllm serve m"]}])
    d = decide_admission(p, cluster(node("l40s-0", "L40S", 4, "shared")), WebhookConfig())
    assert not d.arg_edits
    if strict:
        assert d.status_code == 403 and "strict mode" in d.reason
    else:
        assert d.allowed and any("runs from a shell script" in w for w in d.warnings)


# ---- 8. empty node selector terms --------------------------------------------------------------


def test_empty_term_stays_empty() -> None:
    aff = {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
        {}, {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}]}}}
    p = pod(annotations=SIZED, spec={"affinity": aff})
    snap = cluster(node("h100-a", mig={"1g.10gb": 7}, labels={"pool": "a"}),
                   node("h100-b", mig={"1g.10gb": 7}, labels={"pool": "b"}))
    stored = _apply(p, _answer(_client(snap, ClaimBook()), p, "u"))
    terms = stored["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"]
    assert terms[0] == {}
    assert terms[1]["matchExpressions"][-1]["key"] == "nvidia.com/gpu.product"
    b = {"pool": "b", "nvidia.com/gpu.product": H100}
    assert exclusion(spec_node_level(stored["spec"], "spec"), "h100-b", b, ()) is not None


# ---- 9. a kept decision is validated too ------------------------------------------------


@pytest.mark.parametrize("spec", [
    {"affinity": {"nodeAffinity": {REQ: {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": 5}]}]}}}},
    {"tolerations": [5]},
    {"nodeName": ["h100-0"]},
])
def test_reused_decision_with_unreadable_constraints_is_a_400(spec: dict[str, Any]) -> None:
    p = _copied("copy")
    p["spec"].pop("affinity")
    p["spec"].update(spec)
    book = ClaimBook()
    body = _answer(_client(_one_slice(), book), p, "u")
    assert body["allowed"] is False and body["status"]["code"] == 400, body
    assert body["status"]["message"].startswith("spec."), body
    assert len(book) == 0
