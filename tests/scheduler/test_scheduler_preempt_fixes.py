"""scheduler.extender.verbs.preempt: it reads the live cache state and leaves it exactly as it
was (a guessed share stays a guess), and it never answers a node with no victims
(kube-scheduler fails the whole preemption for that)."""

from __future__ import annotations

from typing import Any

import pytest
from sched_builders import make_cache, node, pod, shared_pod, whole_pod
from test_scheduler_truth import fits, guessed_shares

from kube.cache import ClusterCache
from scheduler.extender.verbs import preempt
from scheduler.extender.wire import PreemptionArgs

# ---- guessed shares stay guessed ----------------------------------------------------------


@pytest.mark.parametrize("victims", [["a"], ["b"], ["a", "b", "c"], []])
def test_preempt_leaves_guessed_shares_guessed(victims: list[str]) -> None:
    cache = guessed_shares()[0]
    with cache.view():
        before = dict(cache.state.nodes["n1"].unsure)
    assert set(before) == {"default/a", "default/b", "default/c"}
    big = shared_pod("d", "20Gi", compute="0.1")
    assert not fits(cache, big)  # a's GPU is a guess: 20Gi may not fit beside it
    uids = [entry.uid for k in victims if (entry := cache.pod_entry(f"default/{k}"))]
    args = PreemptionArgs.decode({
        "Pod": shared_pod("hi", "48Gi", compute="0.1", priority=1000),
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": u} for u in uids],
                                         "NumPDBViolations": 0}}})
    with cache.view() as view:
        preempt(args, view)
        assert dict(view.state.nodes["n1"].unsure) == before
    assert not fits(cache, big)


# ---- no node answered with no victims ----------------------------------------------------


def spare_gpus() -> ClusterCache:
    """n1: 4 GPUs, 2 used by a low-priority pod; n2: its one GPU used by another."""
    return make_cache(
        [node("n1", gpus=4, reconfigurable=False), node("n2", gpus=1, reconfigurable=False)],
        [whole_pod("low", 2, node="n1", uid="u-low", priority=1,
                   annotations={"gpupack.io/gpus": "0,1"}),
         whole_pod("low2", 1, node="n2", uid="u-low2", priority=1,
                   annotations={"gpupack.io/gpus": "0"}),
         pod("cpu", cpu="1", node="n1", uid="u-cpu", priority=0)])


# (the preemptor, kube-scheduler's victims per node, the answer per node (None: dropped))
EMPTY_CASES: list[tuple[dict[str, Any], dict[str, list[str]], dict[str, list[str] | None]]] = [
    # gpupack sees room on n1 without victims: kube-scheduler needed its own (a host
    # port, anti-affinity, the pod count), answered unchanged; n2 needs its victim.
    (whole_pod("hi", 1, priority=1000), {"n1": ["u-low"], "n2": ["u-low2"]},
     {"n1": ["u-low"], "n2": ["u-low2"]}),
    (whole_pod("hi", 1, priority=1000), {"n1": ["u-low", "u-cpu"]},
     {"n1": ["u-low", "u-cpu"]}),
    # Victims gpupack does not count there are kube-scheduler's business too.
    (whole_pod("hi", 1, priority=1000), {"n1": ["unknown-uid"]}, {"n1": ["unknown-uid"]}),
    # Nothing proposed (not what kube-scheduler sends): dropped, never answered empty.
    (whole_pod("hi", 1, priority=1000), {"n1": []}, {"n1": None}),
    # Victims needed for the GPUs: the fewest, as before.
    (whole_pod("hi", 3, priority=1000), {"n1": ["u-low", "u-cpu"]}, {"n1": ["u-low"]}),
    (whole_pod("hi", 8, priority=1000), {"n1": ["u-low"]}, {"n1": None}),
]


@pytest.mark.parametrize(("p", "proposed", "expected"), EMPTY_CASES)
def test_no_node_is_answered_with_an_empty_victim_list(
    p: dict[str, Any], proposed: dict[str, list[str]], expected: dict[str, list[str] | None]
) -> None:
    cache = spare_gpus()
    args = PreemptionArgs.decode({
        "Pod": p,
        "NodeNameToMetaVictims": {n: {"Pods": [{"UID": u} for u in uids],
                                      "NumPDBViolations": 2}
                                  for n, uids in proposed.items()}})
    out = preempt(args, cache).encode()["NodeNameToMetaVictims"]
    assert all(v["Pods"] for v in out.values()), out
    for n, want in expected.items():
        if want is None:
            assert n not in out
        else:
            assert [v["UID"] for v in out[n]["Pods"]] == want
            assert out[n]["NumPDBViolations"] == 2


def test_full_victim_pods_are_answered_by_uid_when_none_is_needed() -> None:
    cache = spare_gpus()
    low = whole_pod("low", 2, node="n1", uid="u-low", priority=1)
    args = PreemptionArgs.decode({"Pod": whole_pod("hi", 1, priority=1000),
                                  "NodeNameToVictims": {"n1": {"Pods": [low],
                                                               "NumPDBViolations": 0}}})
    assert preempt(args, cache).encode() == {"NodeNameToMetaVictims": {
        "n1": {"Pods": [{"UID": "u-low"}], "NumPDBViolations": 0}}}
