"""The DRA participant at the extension points: nodes judged by the allocator's
predicted fit and gpupack's score, a group's kept room never broken, unknown
predictions offered but ranked last, mixed clusters, and the bind's assumed allocation
checked against the claim kube-scheduler allocated."""

from __future__ import annotations

from typing import Any

from builders_dra import claim, claim_pod, dra_node, h100_slices, result, template
from builders_nodes import H100, gpu_node
from prometheus_client import CollectorRegistry, Counter

from kube.cache import ClusterCache
from kube.dra_store import CLAIMS, CLASSES, SLICES, TEMPLATES
from packing.dra import nvidia
from packing.model import Placement, PodRequest, RequestKind
from scheduler.dra.plugin import DraVerbs
from scheduler.extender.points import ExtensionPoints
from scheduler.extender.request_pods import RequestPods
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import BindingArgs, ExtenderArgs
from scheduler.groups.loop import ReservationBook
from scheduler.groups.plugin import GroupVerbs
from scheduler.memo.decide import Memo
from scheduler.memo.loop import Warmer
from scheduler.planner.loop import Planner

MIG_1G = f"device.attributes['{nvidia.DRIVER}'].profile == '1g.10gb'"


class Binder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def bind(self, namespace: str, name: str, uid: str, node_name: str, annotations: Any,
             pod: Any = None) -> None:
        self.calls.append((f"{namespace}/{name}", node_name))


def setup(nodes: list[dict[str, Any]], slices: list[dict[str, Any]],
          claims: list[dict[str, Any]] = (), pods: list[dict[str, Any]] = ()
          ) -> tuple[ExtensionPoints, DraVerbs, Binder]:
    cache = ClusterCache("gpupack")
    cache.replace(nodes, list(pods))
    cache.replace_dra(SLICES, slices)
    cache.replace_dra(CLASSES, nvidia.device_classes())
    cache.replace_dra(CLAIMS, list(claims))
    cache.mark_synced()
    planner = Planner(cache, in_process=True)
    memo = Memo()
    book = ReservationBook(cache, scorer=lambda: planner.scorer.scorer, records_listed=True)
    warmer = Warmer(cache, memo, lambda: planner.scorer)
    lag = ViewLag()
    dra = DraVerbs(cache, warmer.current, memo, lag)
    binder = Binder()
    binds = Counter("binds", "bind outcomes", ["result"], registry=CollectorRegistry())
    pts = ExtensionPoints(cache, planner, binder, (GroupVerbs(book, lag), dra), memo, warmer,
                          RequestPods(), binds, "gpupack", 0, lag, None)
    book.synced()
    return pts, dra, binder


def args(pod: dict[str, Any], names: list[str]) -> ExtenderArgs:
    return ExtenderArgs(pod, None, tuple(names))


def mig_claim(name: str, **kw: Any) -> dict[str, Any]:
    return claim(name, klass=nvidia.MIG_CLASS, selectors=[MIG_1G], **kw)


def test_a_mig_claim_goes_where_its_first_fit_fills_a_gpu_in_use() -> None:
    # Node a has a 1g.10gb partition held on GPU 0; node b is idle. The allocator's first
    # fit on b opens its GPU 0 (and the whole node); on a it lands beside the partition.
    held = mig_claim("held", results=[result("a", "gpu-0-mig-1g10gb-19-0")])
    p = claim_pod("p", claims=["c"])
    pts, _, _ = setup([dra_node("a"), dra_node("b")],
                      h100_slices("a", 2) + h100_slices("b", 2), [held, mig_claim("c")], [p])
    # The filter hands kube-scheduler the best node alone (so the allocation is known).
    assert pts.filter(args(p, ["b", "a"])).node_names == ("a",)
    scores = {h.host: h.score for h in pts.prioritize(args(p, ["b", "a"]))}
    assert scores["a"] > scores["b"]


def test_the_filter_time_fit_is_assumed_until_bind_or_it_expires() -> None:
    # Two pods one after the other, the first not bound yet: the second is predicted with
    # the first's devices taken (as kube-scheduler's allocator holds them in memory).
    p, q = claim_pod("p", claims=["c"]), claim_pod("q", claims=["d"])
    pts, dra, _ = setup([dra_node("a")], h100_slices("a", 2), [claim("c"), claim("d")], [p, q])
    now = [0.0]
    dra.clock = lambda: now[0]
    assert pts.filter(args(p, ["a"])).node_names == ("a",)
    assert pts.cache.state.nodes["a"].gpus[0].whole_owner == "default/c#dra"
    pts.filter(args(q, ["a"]))
    assert pts.cache.state.nodes["a"].gpus[1].whole_owner == "default/d#dra"
    assert pts.bind(BindingArgs("q", "default", "uid-default-q", "a")).error == ""
    # p is never bound (a later step failed): its assumption goes after TENTATIVE_S, at
    # the next filter; q's, made at its bind, stays.
    now[0] = 31.0
    r = claim_pod("r", claims=["e"])
    pts.cache.upsert_pod(r)
    pts.cache.upsert_dra(CLAIMS, claim("e"))
    assert pts.filter(args(r, ["a"])).node_names == ("a",)
    owners = [g.whole_owner for g in pts.cache.state.nodes["a"].gpus]
    assert owners == ["default/e#dra", "default/d#dra"]


def test_a_node_whose_first_fit_takes_a_kept_gpu_is_not_offered() -> None:
    p = claim_pod("p", claims=["c"])
    pts, _, _ = setup([dra_node("a"), dra_node("b")],
                      h100_slices("a", 2) + h100_slices("b", 2), [claim("c")], [p])
    cache = pts.cache
    hold = PodRequest("llm/g#reserve-0", kind=RequestKind.WHOLE, gpu_count=1)
    assert cache.hold(hold, Placement(hold.key, "a", (0,))) is None
    got = pts.filter(args(p, ["a", "b"]))
    assert got.node_names == ("b",)
    assert "gpupack keeps for llm/g" in got.failed["a"]


def test_an_unpredictable_selector_is_offered_and_ranked_last() -> None:
    weird = "device.attributes['gpu.nvidia.com'].productName.matches('H1.*')"
    p = claim_pod("p", claims=["c"])
    q = claim_pod("q", claims=["d"])
    pts, _, _ = setup([dra_node("a")], h100_slices("a", 1),
                      [claim("c", selectors=[weird]), claim("d")], [p, q])
    assert pts.filter(args(p, ["a"])).node_names == ("a",)
    assert [h.score for h in pts.prioritize(args(p, ["a"]))] == [0]
    assert [h.score for h in pts.prioritize(args(q, ["a"]))] == [10]


def test_a_node_where_the_allocator_finds_nothing_is_refused() -> None:
    busy = claim("busy", results=[result("a", "gpu-0")])
    p = claim_pod("p", claims=["c"])
    pts, _, _ = setup([dra_node("a")], h100_slices("a", 1), [busy, claim("c")], [p])
    got = pts.filter(args(p, ["a"]))
    assert got.node_names == () and "finds no devices" in got.failed["a"]


def test_a_claim_the_watch_has_not_shown_is_an_error_to_retry() -> None:
    p = claim_pod("p", claims=["unseen"])
    pts, _, _ = setup([dra_node("a")], h100_slices("a", 1), [], [p])
    assert "behind" in pts.filter(args(p, ["a"])).error


def test_a_template_claim_not_seen_yet_is_read_from_its_template() -> None:
    p = claim_pod("p", templates=["gpu"], generated={"gpu": "p-gpu-x1"})
    pts, _, _ = setup([dra_node("a")], h100_slices("a", 1), [], [p])
    pts.cache.upsert_dra(TEMPLATES, template("gpu"))
    assert pts.filter(args(p, ["a"])).node_names == ("a",)


def test_mixed_cluster_an_extended_resource_pod_is_judged_on_both_kinds() -> None:
    plugin = gpu_node("p", H100, gpus=2, whole=2, hostname=True)
    pod = claim_pod("w", gpus=1)
    pts, dra, _ = setup([plugin, dra_node("d")], h100_slices("d", 2), [], [pod])
    got = pts.filter(args(pod, ["p", "d"]))
    assert len(got.node_names or ()) == 1 and not got.failed  # both fit, one is chosen
    assert dra.verdicts.get("allocated") == 1  # only the DRA node was predicted
    assert {h.host for h in pts.prioritize(args(pod, ["p", "d"]))} == {"p", "d"}


def test_bind_assumes_the_predicted_allocation_and_the_claim_confirms_it() -> None:
    p = claim_pod("p", claims=["c"])
    pts, _, binder = setup([dra_node("a")], h100_slices("a", 2), [claim("c")], [p])
    assert pts.filter(args(p, ["a"])).node_names == ("a",)
    got = pts.bind(BindingArgs("p", "default", "uid-default-p", "a"))
    assert got.error == "" and binder.calls == [("default/p", "a")]
    cache = pts.cache
    assert cache.state.nodes["a"].gpus[0].whole_owner == "default/c#dra"
    # kube-scheduler's PreBind wrote the same device: the watch confirms the prediction.
    cache.upsert_dra(CLAIMS, claim("c", results=[result("a", "gpu-0")], reserved_for=["p"]))
    assert cache.dra.agreements == 1 and cache.dra.disagreements == 0
    # A second pod is predicted on the other GPU.
    q = claim_pod("q", claims=["d"])
    cache.upsert_pod(q)
    cache.upsert_dra(CLAIMS, claim("d"))
    pts.filter(args(q, ["a"]))
    pts.bind(BindingArgs("q", "default", "uid-default-q", "a"))
    assert cache.state.nodes["a"].gpus[1].whole_owner == "default/d#dra"


def test_bind_after_the_watch_showed_the_allocation_compares_it() -> None:
    p = claim_pod("p", claims=["c"])
    pts, _, _ = setup([dra_node("a")], h100_slices("a", 2), [claim("c")], [p])
    pts.filter(args(p, ["a"]))
    pts.cache.upsert_dra(CLAIMS, claim("c", results=[result("a", "gpu-1")]))
    assert pts.bind(BindingArgs("p", "default", "uid-default-p", "a")).error == ""
    assert pts.cache.dra.disagreements == 1  # predicted gpu-0, the scheduler wrote gpu-1


def test_a_pod_without_claims_is_not_the_dra_participants() -> None:
    p = claim_pod("p", cpu="1")
    pts, dra, _ = setup([dra_node("a")], h100_slices("a", 1), [], [p])
    assert pts.filter(args(p, ["a"])).node_names == ("a",)
    assert dra.verdicts == {}


LWS = "leaderworkerset.sigs.k8s.io/"
CLIQUE = "nvidia.com/gpu.clique"


def lws_claim_pod(group: str, worker: int, size: int = 2) -> dict[str, Any]:
    """A LeaderWorkerSet pod asking 8 GPUs through a ResourceClaimTemplate, its groups
    kept inside one NVLink clique."""
    name = group if worker == 0 else f"{group}-{worker}"
    p = claim_pod(name, templates=["gpus"], namespace="llm",
                  generated={"gpus": f"{name}-gpus"},
                  labels={LWS + "name": group.rsplit("-", 1)[0], LWS + "group-index": "0",
                          LWS + "worker-index": str(worker)},
                  annotations={LWS + "size": str(size), LWS + "exclusive-topology": CLIQUE})
    return p


def test_an_lws_group_asking_gpus_through_claims_is_reserved_whole_in_one_clique() -> None:
    nodes = [dra_node(n, labels={CLIQUE: c}) for n, c in
             (("a", "c1"), ("b", "c1"), ("c", "c2"), ("d", "c2"))]
    slices = [s for n in "abcd" for s in h100_slices(n, 8)]
    busy = claim("busy", results=[result("a", "gpu-0")])  # clique c1 cannot hold 2 x 8
    members = [lws_claim_pod("llm-0", w) for w in (0, 1)]
    pts, _, _ = setup(nodes, slices, [busy], members)
    cache = pts.cache
    cache.upsert_dra(TEMPLATES, template("gpus", namespace="llm", count=8))
    req = cache.pending_pod("llm/llm-0")
    assert req is not None and req.kind is RequestKind.WHOLE and req.gpu_count == 8
    placed = {}
    for m in members:
        got = pts.filter(args(m, ["a", "b", "c", "d"]))
        assert got.error == "" and len(got.node_names or ()) == 1, got
        node = got.node_names[0]
        name = m["metadata"]["name"]
        assert pts.bind(BindingArgs(name, "llm", f"uid-llm-{name}", node)).error == ""
        placed[name] = node
    assert set(placed.values()) == {"c", "d"}
    # PreBind wrote each member's claim (first fit: every GPU of its node); the watch
    # shows the claims, then the pods bound: the claims hold the GPUs, the pods CPU.
    for name, node in placed.items():
        cache.upsert_dra(CLAIMS, claim(f"{name}-gpus", namespace="llm", count=8, results=[
            result(node, f"gpu-{i}") for i in range(8)]))
    for m in members:
        name = m["metadata"]["name"]
        bound = dict(m, spec={**m["spec"], "nodeName": placed[name]},
                     status={**m["status"], "phase": "Running"})
        cache.upsert_pod(bound)
    for name, node in placed.items():
        owners = {g.whole_owner for g in cache.state.nodes[node].gpus}
        assert owners == {f"llm/{name}-gpus#dra"}, owners
        assert cache.counted(f"llm/{name}")[1].gpus == ()
