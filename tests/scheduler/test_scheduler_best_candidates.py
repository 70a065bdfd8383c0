"""Filter's best candidates: at most ``top`` fitting nodes, the ones prioritize would
score highest, the planner's node kept; with top 0 every fitting node."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sched_builders import filter_args, make_cache, mig_pod, node, whole_pod
from test_scheduler_verbs import FixedPlan, scorer

from packing.model import Placement
from scheduler.extender.verbs import BestCandidates, NoPlan, filter_nodes, prioritize
from scheduler.extender.wire import ExtenderArgs
from scheduler.memo.decide import Memo

USED = {"gpupack.io/gpus": "0", "gpupack.io/mig": "1g.10gb@0"}


def cluster() -> Any:
    """Four MIG nodes, two with a slice in use (the packing policy prefers those), and
    two whole-GPU nodes."""
    nodes = [node(f"mig-{i}", mig={"1g.10gb": 7}) for i in range(4)]
    nodes += [node(f"whole-{i}", gpus=8, reconfigurable=False) for i in range(2)]
    running = [mig_pod(f"r{i}", node=f"mig-{i}", annotations=USED) for i in (1, 3)]
    return make_cache(nodes, running)


NAMES = ["mig-0", "mig-1", "mig-2", "mig-3", "whole-0", "whole-1"]


@pytest.mark.parametrize(("top", "kept"), [
    (0, ["mig-0", "mig-1", "mig-2", "mig-3"]),
    (1, ["mig-1"]),  # the better of the two used ones in kube-scheduler's order
    (2, ["mig-1", "mig-3"]),
    (3, ["mig-0", "mig-1", "mig-3"]),  # then the fresh ones, in order
    (10, ["mig-0", "mig-1", "mig-2", "mig-3"]),
])
def test_top_fitting_nodes(top: int, kept: list[str]) -> None:
    cache = cluster()
    args = ExtenderArgs.decode(filter_args(mig_pod("asr"), NAMES))
    best = BestCandidates(top, scorer(), NoPlan()) if top else None
    result = filter_nodes(args, cache, Memo(), best)
    assert list(result.node_names) == kept
    # The nodes handed back are those prioritize scores highest among all fitting ones.
    scores = {h.host: h.score for h in prioritize(args, cache, Memo(), scorer(), NoPlan())}
    dropped = set(NAMES) - set(kept) - {"whole-0", "whole-1"}
    assert all(scores[k] >= scores[d] for k in kept for d in dropped)
    # Unfit nodes keep their reasons; dropped fitting nodes are not reported as failed.
    assert set(result.failed) | set(result.unresolvable) == {"whole-0", "whole-1"}


def test_the_plan_node_is_kept_beyond_top() -> None:
    cache = cluster()
    pod = mig_pod("asr")
    plan = FixedPlan(Placement("default/asr", "mig-2", (0,), mig_profile="1g.10gb",
                               mig_start=0))
    args = ExtenderArgs.decode(filter_args(pod, NAMES))
    result = filter_nodes(args, cache, Memo(), BestCandidates(1, scorer(), plan))
    assert list(result.node_names) == ["mig-1", "mig-2"]


def test_whole_gpu_pods_see_the_best_whole_nodes() -> None:
    cache = cluster()
    args = ExtenderArgs.decode(filter_args(whole_pod("llm", 8, namespace="llm"), NAMES))
    result = filter_nodes(args, cache, Memo(), BestCandidates(1, scorer(), NoPlan()))
    assert len(result.node_names) == 1 and result.node_names[0].startswith("whole-")


PREFERRED_NODE = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 50, "preference": {"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}}]}}
PREFERRED_POD = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": {"app": "asr"}}}}]}}
SPREAD = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
          "labelSelector": {"matchLabels": {"app": "asr"}}}


@pytest.mark.parametrize(("spec", "cut"), [
    ({}, True),
    ({"affinity": PREFERRED_NODE}, False),
    ({"affinity": PREFERRED_POD}, False),
    ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "ScheduleAnyway"}]},
     False),
    # Required terms are kube-scheduler's filters, already applied to the candidates.
    ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "DoNotSchedule"}]},
     True),
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
     True),
    ({"affinity": "not a mapping"}, True),
])
def test_pods_with_soft_preferences_get_every_fitting_node(spec: dict[str, Any],
                                                           cut: bool) -> None:
    # kube-scheduler's score plugins weigh such preferences only among the nodes filter
    # hands back: one node would leave them nothing to weigh.
    cache = cluster()
    p = mig_pod("asr")
    p["spec"].update(spec)
    args = ExtenderArgs.decode(filter_args(p, NAMES))
    result = filter_nodes(args, cache, Memo(), BestCandidates(1, scorer(), NoPlan()))
    assert list(result.node_names) == (["mig-1"] if cut else
                                       ["mig-0", "mig-1", "mig-2", "mig-3"])


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2), st.integers(0, 2)),
                min_size=1, max_size=40),
       st.integers(1, 6))
def test_best_candidates_are_the_top_of_the_full_order(
        nodes: list[tuple[int, int, int]], top: int) -> None:
    """select reads the tie-break (in_use_first) only for nodes whose preference is at
    most the top-th best; the nodes it keeps are still the first ``top`` in the full order
    (preference, in_use_first, position), as prioritize's winner() breaks ties, whatever
    the ties among preferences and free CPU and memory. A node without a preference
    (None) comes after every scored one."""
    from types import SimpleNamespace

    from packing.scoring import in_use_first
    from scheduler.memo.decide import NodeEval, ScorerRef

    names = [f"n{i:02d}" for i in range(len(nodes))]
    state: Any = SimpleNamespace(nodes={
        n: SimpleNamespace(cpu_free=cpu, mem_free=mem) for n, (_, cpu, mem) in zip(
            names, nodes, strict=True)})
    evals = [NodeEval(True, score_gen=7, pref=None if p == 3 else (p,))
             for p, _, _ in nodes]
    ref = ScorerRef(lambda *a: (0,), 7)
    got = BestCandidates(top, ref, NoPlan()).select(list(names), evals, None, "ns/p",  # type: ignore[arg-type]
                                                    state)
    scored = sorted((ev.pref, in_use_first(state, n), i)
                    for i, (n, ev) in enumerate(zip(names, evals, strict=True))
                    if ev.pref is not None)
    want = [i for _, _, i in scored[:top]]
    want += [i for i, ev in enumerate(evals) if ev.pref is None][: top - len(want)]
    assert got == [names[i] for i in sorted(want)]
