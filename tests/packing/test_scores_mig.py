"""The extender's scorer (packing/policies/gpupack.py GpupackScorer) for MIG pods on
slices that exist: a free slice on a GPU that already hosts pods comes before one on an
idle MIG GPU, so idle GPUs stay idle for the MIG actuator to re-lay out or turn whole;
of GPUs in use, the fullest (fewest free memory slices) first."""

from __future__ import annotations

import pytest
from packing_builders import mig, node

from packing.model import GpuMode, MigReconfigure, Placement, Snapshot
from packing.policies.gpupack import make_gpupack_scorer
from packing.scoring import best_option
from packing.state import ClusterState

SEVEN_1G = [("1g.10gb", s) for s in range(7)]
BALANCED = [("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)]
FIXED = MigReconfigure.NOT_OPTED_IN  # layouts as reported: only existing slices


def cluster(layouts: dict[str, dict[int, list[tuple[str, int]]]],
            running: list[tuple[str, str, int, str, int]]) -> Snapshot:
    nodes = tuple(node(name, len(lay), mode=GpuMode.MIG, layouts=lay, reconfigure=FIXED)
                  for name, lay in layouts.items())
    pods = tuple((mig(key, prof), Placement(key, n, (g,), prof, start))
                 for key, n, g, prof, start in running)
    return Snapshot(nodes=nodes, running=pods)


CASES = [
    # (name, layouts, running pods, pod profile, expected (node, gpu))
    ("same node: the GPU with a pod, not the idle one",
     {"a": {0: SEVEN_1G, 1: SEVEN_1G}}, [("r/0", "a", 0, "1g.10gb", 3)], "1g.10gb",
     ("a", 0)),
    ("other node: the GPU with a pod, not an idle GPU of an emptier node",
     {"a": {0: SEVEN_1G}, "b": {0: SEVEN_1G, 1: SEVEN_1G}},
     [("r/0", "b", 1, "1g.10gb", 0)], "1g.10gb", ("b", 1)),
    # Here the fragmentation term alone (FGD, ranked before best fit) picks the idle GPU.
    ("balanced layouts: the 1g on the GPU that hosts a 1g, whatever FGD says",
     {"a": {0: [("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6)],
            1: [("2g.20gb", 0), ("2g.20gb", 2)]},
      "b": {0: BALANCED, 1: BALANCED}}, [("r/0", "b", 1, "1g.10gb", 1)], "1g.10gb",
     ("b", 1)),
    ("balanced layouts: the 2g on the GPU that hosts a 1g",
     {"a": {0: BALANCED, 1: BALANCED}}, [("r/0", "a", 1, "1g.10gb", 0)], "2g.20gb",
     ("a", 1)),
    # Best fit by GPU: of two GPUs in use, the one with fewer free memory slices, on the
    # same node and across nodes (the emptier GPU is left to empty).
    ("two GPUs in use: the fuller one",
     {"a": {0: SEVEN_1G, 1: SEVEN_1G}},
     [("r/0", "a", 0, "1g.10gb", 0), ("r/1", "a", 1, "1g.10gb", 0),
      ("r/2", "a", 1, "1g.10gb", 1), ("r/3", "a", 1, "1g.10gb", 2)], "1g.10gb", ("a", 1)),
    ("two GPUs in use on two nodes: the fuller one",
     {"a": {0: SEVEN_1G}, "b": {0: SEVEN_1G}},
     [("r/0", "a", 0, "1g.10gb", 0), ("r/1", "a", 0, "1g.10gb", 1),
      ("r/2", "b", 0, "1g.10gb", 0), ("r/3", "b", 0, "1g.10gb", 1),
      ("r/4", "b", 0, "1g.10gb", 2)], "1g.10gb", ("b", 0)),
    # The placement score alone picks b's GPU 1 (5 free slices, 2 pods); best fit by GPU
    # takes a's balanced GPU, whose 3g pod leaves 4 free slices.
    ("the fuller GPU though it has fewer pods",
     {"a": {0: BALANCED}, "b": {0: SEVEN_1G, 1: SEVEN_1G}},
     [("r/0", "a", 0, "3g.40gb", 4), ("r/1", "b", 1, "1g.10gb", 0),
      ("r/2", "b", 1, "1g.10gb", 6)], "1g.10gb", ("a", 0)),
]


@pytest.mark.parametrize("name,layouts,running,profile,expect", CASES,
                         ids=[c[0] for c in CASES])
def test_mig_pod_goes_to_a_gpu_that_already_hosts_pods(
        name: str, layouts: dict[str, dict[int, list[tuple[str, int]]]],
        running: list[tuple[str, str, int, str, int]], profile: str,
        expect: tuple[str, int]) -> None:
    snap = cluster(layouts, running)
    pod = mig("new/0", profile)
    for scorer in (make_gpupack_scorer(snap), make_gpupack_scorer(Snapshot(nodes=()))):
        state = ClusterState(snap)  # the running pods applied
        best = best_option(state, pod, scorer)
        assert best is not None and (best.node, best.gpus[0]) == expect, name
