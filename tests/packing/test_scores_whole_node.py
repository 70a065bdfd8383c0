"""Whole nodes stay whole on clusters that run LLM groups: there the extender's scorer
(and the openb replay, with the same term) puts a whole-GPU pod on a node already in use
wherever one fits, and opens an untouched node only for a pod that takes all of it or
fits nowhere else. Elsewhere (no group pods, no NVLink cliques) the rank decides alone.

The regression: before a LeaderWorkerSet's pods exist, the scorer's typical shapes hold
only small pods, and an empty 8-GPU node could rank one FGD level above a used node's
free whole GPU; kube-scheduler then sent single-GPU pods there and the LLM group that came
next found no node (tests/e2e/test_e2e_workload.py, once in four CI runs)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from packing_builders import mig, node, shared, whole

from packing.fragmentation import MilliRequest
from packing.groups.members import CLIQUE_LABEL, KEEP_WHOLE_NODES_LABEL
from packing.model import (
    GPU_MILLI,
    GpuMode,
    GroupRef,
    MigInstance,
    MigReconfigure,
    NodeInfo,
    Placement,
    PodRequest,
    Snapshot,
)
from packing.policies.gpupack import make_gpupack_scorer
from packing.policies.lookahead import keeps_whole_nodes, opens_whole_node
from packing.scoring import best_option
from packing.state import ClusterState

FIXED = MigReconfigure.NOT_OPTED_IN


def _req(num_gpu: int, milli: int = GPU_MILLI) -> MilliRequest:
    return MilliRequest(1000, 1024, num_gpu, milli, np.ones(1, dtype=np.bool_))


@pytest.mark.parametrize(("n_full", "gpu_count", "req", "opens"), [
    (8, 8, _req(1), True),  # one GPU of an untouched node
    (8, 8, _req(7), True),
    (8, 8, _req(8), False),  # the whole node: what whole nodes are for
    (4, 4, _req(4), False),
    (7, 8, _req(1), False),  # in use already
    (0, 0, _req(1), False),  # no GPUs
    (8, 8, _req(1, 500), False),  # a share is not a whole-GPU pod
    (8, 8, _req(0, 0), False),  # CPU only
])
def test_opens_whole_node(n_full: int, gpu_count: int, req: MilliRequest, opens: bool) -> None:
    assert bool(opens_whole_node(n_full, gpu_count, req)) is opens
    vec = opens_whole_node(np.array([n_full, 0]), np.array([gpu_count, 8]), req)
    assert vec.tolist() == [opens, False]


def _mixed(name: str) -> NodeInfo:
    """Like the e2e test's mig-1: GPUs 0-3 whole, 4-7 in MIG mode (7 x 1g.10gb each)."""
    n = node(name, 8, reconfigure=FIXED)
    gpus = list(n.gpus)
    for i in range(4, 8):
        gpus[i] = replace(gpus[i], mode=GpuMode.MIG,
                          mig=tuple(MigInstance("1g.10gb", s) for s in range(7)))
    return replace(n, gpus=tuple(gpus))


# (small pods the scorer's typical shapes come from, single-GPU pods on mig-1 already).
# The first two chose the empty node before the whole-node term.
TTS = [mig(f"tts/{i}", "2g.20gb") for i in range(4)]
WORKLOADS = [
    ([mig(f"asr/{i}") for i in range(5)] + [shared(f"emb/{i}") for i in range(5)] + TTS, 1),
    ([mig(f"asr/{i}") for i in range(10)] + TTS, 1),
    ([mig(f"asr/{i}") for i in range(10)] + TTS, 2),
    ([], 0),
    ([shared(f"emb/{i}") for i in range(6)], 3),
]


def _cluster(workload: list[PodRequest], held: int, clique: bool = True) -> Snapshot:
    running = tuple((whole(f"rr/{i}"), Placement(f"rr/{i}", "mig-1", (i,)))
                    for i in range(held))
    labels = {CLIQUE_LABEL: "clique-a"} if clique else {}
    return Snapshot(nodes=(_mixed("mig-1"), node("a-0", 8, reconfigure=FIXED, labels=labels)),
                    running=running, pending=tuple(workload))


@pytest.mark.parametrize(("workload", "held"), WORKLOADS)
def test_a_single_gpu_pod_keeps_off_an_untouched_node(workload: list[PodRequest],
                                                       held: int) -> None:
    snap = _cluster(workload, held)
    scorer = make_gpupack_scorer(snap)
    state = ClusterState(snap)
    best = best_option(state, whole("rr/next"), scorer)
    assert best is not None and best.node == "mig-1", best
    # The whole node still takes what only it can hold, and a pod that takes all of it.
    assert best_option(state, whole("llm/0", 8), scorer).node == "a-0"
    assert best_option(state, whole("big/0", 5), scorer).node == "a-0"


def test_an_exact_whole_node_before_breaking_a_larger_one() -> None:
    clique = {CLIQUE_LABEL: "c"}
    snap = Snapshot(nodes=(node("four", 4, reconfigure=FIXED, labels=clique),
                           node("eight", 8, reconfigure=FIXED, labels=clique)))
    state = ClusterState(snap)
    best = best_option(state, whole("p/0", 4), make_gpupack_scorer(snap))
    assert best is not None and best.node == "four"


@pytest.mark.parametrize(("clique", "group_pod", "label", "keeps"), [
    (True, False, None, True),  # an NVLink clique: its nodes are where groups go
    (False, True, None, True),  # a group's pod in the workload
    (False, False, "true", True),  # an operator's label: groups will come
    (False, False, "false", False),
    (False, False, "yes", False),  # only "true" says so
    (False, False, None, False),  # none: the rank decides alone (the openb traces)
])
def test_whole_nodes_are_kept_where_groups_run(clique: bool, group_pod: bool,
                                               label: str | None, keeps: bool) -> None:
    workload, held = WORKLOADS[0]
    extra = [whole("llm/0-1", 8, group=GroupRef("ns/llm-0", 2))] if group_pod else []
    snap = _cluster(workload + extra, held, clique=clique)
    if label is not None:
        labelled = replace(snap.nodes[0], labels={**snap.nodes[0].labels,
                                                   KEEP_WHOLE_NODES_LABEL: label})
        snap = replace(snap, nodes=(labelled, *snap.nodes[1:]))
    assert keeps_whole_nodes(snap) is keeps
    best = best_option(ClusterState(snap), whole("rr/next"), make_gpupack_scorer(snap))
    assert best is not None
    # WORKLOADS[0] is one where the rank alone prefers the empty node.
    assert best.node == ("mig-1" if keeps else "a-0")
