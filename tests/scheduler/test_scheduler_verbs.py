"""The verbs, table-driven, on caches fed with Node/Pod objects."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from sched_builders import (
    L40S,
    filter_args,
    make_cache,
    mig_pod,
    node,
    pod,
    shared_pod,
    whole_pod,
)

from packing.model import Placement, Snapshot
from packing.policies.gpupack import make_gpupack_scorer
from packing.status import Code, Status
from scheduler.extender.cycle import VerbError
from scheduler.extender.verbs import (
    NODE_FIT,
    NODE_KNOWN,
    UNKNOWN_NODE,
    UNREADABLE_NODE,
    NoPlan,
    choose_placement,
    filter_nodes,
    preempt,
    prioritize,
)
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import ExtenderArgs, PreemptionArgs
from scheduler.memo.decide import Memo, ScorerRef, preference

NODES = [
    node("mig-a", mig={"1g.10gb": 7}),  # GPU 0: 7 x 1g.10gb; GPUs 1..7 MIG, empty
    node("mig-frozen", gpus=1, mig={"1g.10gb": 1, "3g.40gb": 1}, reconfigurable=False),
    node("mig-3g-only", gpus=1, mig={"3g.40gb": 1}, reconfigurable=False),
    node("l40s", product=L40S, gpus=2, shared_replicas=2),
    node("whole", gpus=8, reconfigurable=False),
    node("whole-2", gpus=2, reconfigurable=False),
    node("cordoned", gpus=8, unschedulable=True),
]
RUNNING = [
    mig_pod("held", node="mig-frozen"),
    whole_pod("big", 6, node="whole-2".replace("-2", ""), namespace="llm"),  # 6 of 8 on "whole"
    shared_pod("ts-0", memory="40Gi", compute="0.5", node="l40s"),
    shared_pod("ts-1", memory="40Gi", compute="0.5", node="l40s"),
]
ALL = [n["metadata"]["name"] for n in NODES]


def scorer() -> ScorerRef:
    return ScorerRef(make_gpupack_scorer(Snapshot(nodes=())), 1)


@pytest.fixture
def cache() -> Any:
    return make_cache(NODES, RUNNING)


# A frozen node's filter reason says why no slice is created there (issue 19).
NO_1G_FROZEN = ("no free 1g.10gb slice on any GPU, and none is created here: the node "
                'freezes its MIG layout (gpupack.io/mig-reconfigure: "false"); '
                "largest placeable: 3g.40gb")
FILTER_CASES = [
    # (pod, names, kept, failed {node: substring}, unresolvable {node: substring})
    (mig_pod("asr"), ALL, ["mig-a"],
     {"mig-frozen": NO_1G_FROZEN},
     {"mig-3g-only": NO_1G_FROZEN,
      "l40s": "no GPU of a usable kind", "whole": "no GPU of a usable kind",
      "whole-2": "no GPU of a usable kind", "cordoned": "cordoned"}),
    (mig_pod("big-slice", "3g.40gb"), ["mig-frozen", "mig-a"], ["mig-frozen", "mig-a"], {}, {}),
    (whole_pod("llm", 2), ["whole", "whole-2", "mig-a"], ["whole", "whole-2"], {},
     {"mig-a": "no GPU of a usable kind"}),
    (whole_pod("llm3", 3), ["whole", "whole-2"], [],
     {"whole": "2 whole GPU(s) free, 3 needed"}, {"whole-2": "node has 2 usable GPU(s)"}),
    (shared_pod("ts-2", memory="8Gi", compute="0.25"), ["l40s", "whole"], ["l40s"], {},
     {"whole": "no GPU of a usable kind"}),
    (shared_pod("ts-big", memory="44Gi", compute="0.25"), ["l40s"], [],
     {"l40s": "no GPU share"}, {}),
    (mig_pod("asr"), ["ghost", "mig-a"], ["mig-a"], {"ghost": UNKNOWN_NODE}, {}),
    (pod("cpu-only", cpu="63500m"), ["whole"], [], {"whole": "insufficient cpu"}, {}),
    (pod("cpu-huge", cpu="900"), ["whole"], [], {}, {"whole": "insufficient cpu"}),
]


@pytest.mark.parametrize(("p", "names", "kept", "failed", "never"), FILTER_CASES)
def test_filter(cache: Any, p: dict[str, Any], names: list[str], kept: list[str],
                failed: dict[str, str], never: dict[str, str]) -> None:
    # The refusals as they read once no "view behind" grace is left (grace 0): a node
    # with fewer GPUs than asked is one kube-scheduler's own fit would not offer.
    result = filter_nodes(ExtenderArgs.decode(filter_args(p, names)), cache, Memo(),
                          lag=ViewLag(grace_s=0))
    assert list(result.node_names or ()) == kept
    assert set(result.failed) == set(failed)
    assert set(result.unresolvable) == set(never)
    for name, text in failed.items():
        assert text in result.failed[name]
    for name, text in never.items():
        assert text in result.unresolvable[name]
    assert set(kept) | set(failed) | set(never) == set(names)


# (pod, candidate names, the error says) when nothing fits and a candidate is not seen yet.
UNSEEN_CASES = [
    (mig_pod("asr"), ["ghost"], "behind on 1 of them (such as ghost:"),
    (whole_pod("llm3", 3), ["whole", "ghost", "ghost-2"], "behind on 2 of them (such as ghost:"),
    # Known, but with no 2g.20gb instance at all: kube-scheduler counted one there.
    (mig_pod("tts", "2g.20gb"), ["mig-frozen", "whole"], "behind on 2 of them (such as "
                                                          "mig-frozen:"),
    (whole_pod("llm9", 9), ["whole"], "behind on 1 of them (such as whole:"),
]


@pytest.mark.parametrize(("p", "names", "says"), UNSEEN_CASES)
def test_filter_with_nothing_fitting_and_a_node_not_seen_yet_is_an_error(
        cache: Any, p: dict[str, Any], names: list[str], says: str) -> None:
    """A refusal would park the pod in kube-scheduler until a later cluster event; the
    node kube-scheduler already knows may be the one that fits once the watch shows it."""
    result = filter_nodes(ExtenderArgs.decode(filter_args(p, names)), cache, Memo())
    assert says in result.error and "try again" in result.error
    assert not result.node_names


def test_a_node_whose_object_cannot_be_read_is_refused_for_good_not_waited_for(
        cache: Any) -> None:
    broken = {"metadata": {"name": "broken", "labels": {"nvidia.com/gpu.count": "lots"}},
              "status": {"allocatable": {"nvidia.com/gpu": "x"}}}
    assert cache.upsert_node(broken) is False
    assert cache.unreadable_node("broken")
    args = ExtenderArgs.decode(filter_args(whole_pod("llm3", 3), ["whole", "broken"]))
    result = filter_nodes(args, cache, Memo())
    assert result.error == "" and result.unresolvable["broken"] == UNREADABLE_NODE
    # Readable again: an ordinary node; deleted or relisted without it: unseen again.
    readable = copy.deepcopy(next(n for n in NODES if n["metadata"]["name"] == "whole"))
    readable["metadata"]["name"] = "broken"
    assert cache.upsert_node(readable)
    assert not cache.unreadable_node("broken")
    cache.upsert_node(broken)
    assert not cache.unreadable_node("broken")  # it was read once: its last state stays
    cache.delete_node("broken")
    cache.upsert_node(broken)
    assert cache.unreadable_node("broken")
    cache.replace(NODES, None)
    assert not cache.unreadable_node("broken")


def test_filter_full_nodes_mode_returns_node_objects(cache: Any) -> None:
    objs = [n for n in NODES if n["metadata"]["name"] in ("mig-a", "l40s")]
    args = ExtenderArgs.decode({"pod": mig_pod("asr"), "nodes": {"items": objs},
                                "nodenames": None})
    result = filter_nodes(args, cache, Memo()).encode()
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["mig-a"]
    assert "l40s" in result["FailedAndUnresolvableNodes"]


def test_filter_memo_is_invalidated_by_a_change_on_the_node(cache: Any) -> None:
    memo = Memo()
    args = ExtenderArgs.decode(filter_args(whole_pod("llm", 2), ["whole"]))
    assert filter_nodes(args, cache, memo).node_names == ("whole",)
    assert filter_nodes(args, cache, memo).node_names == ("whole",)
    assert memo.hits == 1
    cache.upsert_pod(whole_pod("more", 1, node="whole"))
    result = filter_nodes(args, cache, memo)
    assert result.node_names == ()
    assert "1 whole GPU(s) free" in result.failed["whole"]


def test_filter_unreadable_pod_is_a_verb_error(cache: Any) -> None:
    bad = pod("x", {"nvidia.com/gpu": "1.5"})
    with pytest.raises(VerbError, match=r"nvidia.com/gpu"):
        filter_nodes(ExtenderArgs.decode(filter_args(bad, ["whole"])), cache, Memo())


class FixedPlan:
    def __init__(self, p: Placement | None) -> None:
        self.p = p

    def placement_of(self, pod_key: str) -> Placement | None:
        return self.p if self.p is not None and self.p.pod == pod_key else None


def test_prioritize_prefers_partly_used_gpus_and_keeps_whole_nodes_whole() -> None:
    nodes = [node("fresh", mig={"1g.10gb": 7}), node("used", mig={"1g.10gb": 7})]
    running = [mig_pod("r0", node="used",
                       annotations={"gpupack.io/gpus": "0", "gpupack.io/mig": "1g.10gb@0"})]
    cache = make_cache(nodes, running)
    out = prioritize(ExtenderArgs.decode(filter_args(mig_pod("asr"), ["fresh", "used", "nope"])),
                     cache, Memo(), scorer(), NoPlan())
    scores = {h.host: h.score for h in out}
    assert scores == {"used": 10, "fresh": 0}  # the unknown node is left out


def test_prioritize_gives_the_plan_node_ten_alone() -> None:
    # The policy alone would fill "used" (6 of 8 GPUs taken); the plan chose "fresh".
    cache = make_cache([node("fresh", gpus=8, reconfigurable=False),
                        node("used", gpus=8, reconfigurable=False)],
                       [whole_pod("big", 6, node="used", namespace="llm")])
    p = whole_pod("llm", 2, namespace="llm")
    plan = FixedPlan(Placement("llm/llm", "fresh", (0, 1)))
    out = prioritize(ExtenderArgs.decode(filter_args(p, ["used", "fresh"])), cache, Memo(),
                     scorer(), plan)
    scores = {h.host: h.score for h in out}
    assert scores["fresh"] == 10
    assert scores["used"] <= 9


def test_prioritize_the_plan_yields_to_the_name_order_among_equal_nodes(cache: Any) -> None:
    # "whole" (2 of 8 free) and "whole-2" (2 of 2) are alike to the policy for a 2-GPU
    # pod: the plan's choice between them was arbitrary, the name order is not.
    p = whole_pod("llm", 2, namespace="llm")
    plan = FixedPlan(Placement("llm/llm", "whole-2", (0, 1)))
    out = prioritize(ExtenderArgs.decode(filter_args(p, ["whole-2", "whole"])), cache, Memo(),
                     scorer(), plan)
    assert {h.host: h.score for h in out} == {"whole": 10, "whole-2": 9}


@pytest.mark.parametrize("order", [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 4, 0, 3, 1]])
def test_prioritize_gives_one_of_equal_nodes_ten_whatever_the_candidate_order(
        order: list[int]) -> None:
    # kube-scheduler breaks equal totals at random: equal empty nodes all scored 10 let
    # two pods of a burst open two nodes. One winner, by name, in any window.
    names = [f"l40s-{i}" for i in (7, 10, 100, 13, 4)]
    cache = make_cache([node(n, product=L40S, gpus=4, shared_replicas=4) for n in names])
    args = ExtenderArgs.decode(filter_args(shared_pod("emb"), [names[i] for i in order]))
    scores = {h.host: h.score for h in prioritize(args, cache, Memo(), scorer(), NoPlan())}
    assert scores == {n: 10 if n == "l40s-10" else 9 for n in names}


def test_prioritize_scores_are_within_range_and_unfit_nodes_get_zero(cache: Any) -> None:
    out = prioritize(ExtenderArgs.decode(filter_args(mig_pod("asr"), ALL)), cache, Memo(),
                     scorer(), NoPlan())
    assert [h.host for h in out] == ALL
    assert all(0 <= h.score <= 10 for h in out)
    assert {h.host for h in out if h.score} == {"mig-a"}


def test_preference_drops_name_tie_breakers() -> None:
    assert preference((1, 2.0, "node-a", (0,), 3)) == (1, 2.0)
    assert preference((5,)) == (5,)


def test_choose_placement_uses_the_plan_while_free_else_the_scorer(cache: Any) -> None:
    req = cache.pending_pod("default/x") or None
    assert req is None
    cache.upsert_pod(whole_pod("llm", 2, namespace="llm"))
    req = cache.pending_pod("llm/llm")
    planned = Placement("llm/llm", "whole", (6, 7))
    assert choose_placement(cache, req, "whole", scorer().scorer, FixedPlan(planned)) == planned
    stale = Placement("llm/llm", "whole", (0, 1))  # held by "big"
    got = choose_placement(cache, req, "whole", scorer().scorer, FixedPlan(stale))
    assert isinstance(got, Placement) and got.gpus == (6, 7)
    no_fit = choose_placement(cache, req, "mig-frozen", scorer().scorer, NoPlan())
    assert isinstance(no_fit, Status) and no_fit.check == NODE_FIT
    assert no_fit.code is Code.UNSCHEDULABLE and "does not fit" in no_fit.message
    ghost = choose_placement(cache, req, "ghost", scorer().scorer, NoPlan())
    assert isinstance(ghost, Status) and ghost.check == NODE_KNOWN
    assert ghost.code is Code.UNRESOLVABLE and "not in gpupack's cache" in ghost.message


# ---- preempt ---------------------------------------------------------------------------------

def _victim_cluster() -> Any:
    nodes = [node("w", gpus=4, reconfigurable=False), node("l", product=L40S, gpus=1,
                                                           shared_replicas=4)]
    running = [
        whole_pod(f"v{i}", 1, node="w", priority=prio, uid=f"u{i}",
                  annotations={"gpupack.io/gpus": str(i)})
        for i, prio in enumerate([100, 5, 50, 1])
    ] + [pod("cpu-hog", cpu="1", node="w", uid="u-cpu", priority=0)]
    return make_cache(nodes, running)


def _meta(node_victims: dict[str, list[str]], p: dict[str, Any]) -> PreemptionArgs:
    return PreemptionArgs.decode({
        "Pod": p,
        "NodeNameToMetaVictims": {
            n: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 1}
            for n, uids in node_victims.items()
        },
    })


PREEMPT_CASES = [
    # (pod, proposed victims per node, expected victims per node (None: node dropped))
    (whole_pod("need2", 2, priority=1000), {"w": ["u0", "u1", "u2", "u3", "u-cpu"]},
     {"w": ["u1", "u3"]}),
    (whole_pod("need1", 1, priority=1000), {"w": ["u0", "u2"]}, {"w": ["u2"]}),
    (whole_pod("need5", 5, priority=1000), {"w": ["u0", "u1", "u2", "u3"]}, {"w": None}),
    (mig_pod("asr", priority=1000), {"w": ["u0", "u1"]}, {"w": None}),
    # Fits without victims as gpupack sees it: kube-scheduler's own victims, unchanged
    # (an empty list would fail the whole preemption; see verbs.preempt).
    (pod("tiny", cpu="1", priority=1000), {"w": ["u0", "u-cpu"]}, {"w": ["u0", "u-cpu"]}),
    (whole_pod("need1", 1), {"ghost": ["u0"]}, {"ghost": None}),
    (whole_pod("need1", 1), {"w": ["unknown-uid"]}, {"w": None}),
    # One pod listed twice is one victim (undoing it twice used to hand its CPU back twice).
    (whole_pod("need1", 1, priority=1000), {"w": ["u2", "u2"]}, {"w": ["u2"]}),
    (whole_pod("need2", 2, priority=1000), {"w": ["u1", "u3", "u1", "u3"]},
     {"w": ["u1", "u3"]}),
]


@pytest.mark.parametrize(("p", "proposed", "expected"), PREEMPT_CASES)
def test_preempt_returns_only_victims_that_free_what_is_needed(
    p: dict[str, Any], proposed: dict[str, list[str]], expected: dict[str, list[str] | None]
) -> None:
    cache = _victim_cluster()
    before = {n: cache.gen(n) for n in ("w", "l")}
    free = {n: (x.cpu_free, x.mem_free) for n, x in cache.state.nodes.items()}
    result = preempt(_meta(proposed, p), cache).encode()["NodeNameToMetaVictims"]
    for n, want in expected.items():
        if want is None:
            assert n not in result
        else:
            assert sorted(v["UID"] for v in result[n]["Pods"]) == sorted(want)
            assert result[n]["NumPDBViolations"] == (1 if want else 0)
    # Trying victim sets must leave the state exactly as it was.
    assert {n: cache.gen(n) for n in ("w", "l")} == before
    assert {n: (x.cpu_free, x.mem_free) for n, x in cache.state.nodes.items()} == free
    assert cache.state.whole_gpus_free() == 0


def test_preempt_with_full_victim_pods() -> None:
    cache = _victim_cluster()
    victims = [whole_pod("v3", 1, node="w", uid="u3", priority=1),
               whole_pod("v0", 1, node="w", uid="u0", priority=100)]
    args = PreemptionArgs.decode({"pod": whole_pod("need1", 1, priority=1000),
                                  "nodeNameToVictims": {"w": {"pods": victims,
                                                              "numPDBViolations": 0}}})
    out = preempt(args, cache).encode()
    assert out == {"NodeNameToMetaVictims": {"w": {"Pods": [{"UID": "u3"}],
                                                   "NumPDBViolations": 0}}}
