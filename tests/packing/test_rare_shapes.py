"""The rare-shape price (packing.policies.rare): which shapes are rare, what a placement
pays, and that the extender's planner carries the nodes' capacity to every scorer it
builds (the verbs', the warm child's and the solver's)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packing_builders import node, whole

from packing.cpsat import SolverParams
from packing.fragmentation import MilliRequest, ShapeKey, make_shapes
from packing.model import GPU_MILLI, Placement, Snapshot
from packing.policies.fgd import capacity_classes, shape_workload, workload_of
from packing.policies.gpupack import GpupackScorer, make_gpupack_scorer, rare_shapes_key
from packing.policies.rare import RARE_WEIGHT, NodeCapacity, RareShapeRule
from packing.state import ClusterState
from scheduler.planner.solve import (
    SnapshotPacker,
    SolveJob,
    compact_nodes,
    compact_workload,
    expand_workload,
    unpack,
)

ANY = frozenset[str]()
OK = np.ones(2, dtype=bool)


def req_(cpu: int, mem: int, num_gpu: int, milli: int) -> MilliRequest:
    return MilliRequest(cpu, mem, num_gpu, milli, OK)
MODELS = ("G2", "G3")


def capacity(*rows: tuple[int, int, int, int, int]) -> NodeCapacity:
    """Nodes from (count, cpu cores, memory GiB, GPUs, model id) rows."""
    expanded = [r[1:] for r in rows for _ in range(r[0])]
    cpu, mem, gpus, model = (np.array(c, dtype=np.int64) for c in zip(*expanded, strict=True))
    return NodeCapacity(cpu=cpu * 1000, mem=mem * 1024, gpus=gpus, model=model)


def shapes(*keys: ShapeKey):  # type: ignore[no-untyped-def]
    return make_shapes([(k, 1.0 / len(keys)) for k in keys], MODELS)


BIG = ShapeKey(120_000, 8, GPU_MILLI, ANY)  # 8 GPUs, 120 cores
ONE = ShapeKey(12_000, 1, GPU_MILLI, ANY)
G3_SHARE = ShapeKey(4_000, 1, 500, frozenset({"G3"}))
CLUSTER = capacity((39, 96, 384, 8, 0), (1, 128, 768, 8, 1))  # one host of 40: 2.5%


@pytest.mark.parametrize(("cluster", "keys", "rare"), [
    # one host of 40 nodes (2.5%): rare; the one-GPU shape fits all 40
    (CLUSTER, (BIG, ONE), [BIG]),
    # a share bound to the one G3 node is rare too
    (CLUSTER, (ONE, G3_SHARE), [G3_SHARE]),
    # 2 hosts of 40 (5%): at the share, rare; 3 (7.5%): not
    (capacity((38, 96, 384, 8, 0), (2, 128, 768, 8, 1)), (BIG, ONE), [BIG]),
    (capacity((37, 96, 384, 8, 0), (3, 128, 768, 8, 1)), (BIG, ONE), []),
    # a shape no node can host is not rare (nothing to keep)
    (capacity((40, 96, 384, 8, 0)), (BIG, ONE), []),
    # on a small cluster one host is more than 5%: nothing is rare
    (capacity((3, 96, 384, 8, 0), (1, 128, 768, 8, 1)), (BIG, ONE), []),
])
def test_which_shapes_are_rare(cluster: NodeCapacity, keys: tuple[ShapeKey, ...],
                               rare: list[ShapeKey]) -> None:
    rule = RareShapeRule.of(shapes(*keys), cluster)
    assert rule.active is bool(rare)
    assert [(int(c), int(g), int(m)) for c, g, m in zip(rule.cpu, rule.num_gpu, rule.milli,
                                                       strict=True)] == [
        (k.cpu_milli, k.num_gpu, k.gpu_milli) for k in rare]


def _arrays(free: list[list[int]], cpu: list[int], model: list[int]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (np.array(free, dtype=np.int64), np.array(cpu, dtype=np.int64) * 1000,
            np.full(len(cpu), 768 * 1024, dtype=np.int64), np.array(model, dtype=np.int64))


FULL = [GPU_MILLI] * 8


@pytest.mark.parametrize(("request_", "free", "cpu", "want"), [
    # a one-GPU pod on the idle G3 node takes its room for the 8-GPU pod; on a G2 node
    # (which never hosts it) or a G3 node already short of a GPU it pays nothing
    (req_(12_000, 0, 1, GPU_MILLI), [FULL, FULL, [0, *FULL[1:]]], [128, 96, 116],
     [RARE_WEIGHT, 0.0, 0.0]),
    # a CPU-only pod that leaves 120 cores pays nothing; one that leaves 119 pays
    (req_(8_000, 0, 0, 0), [FULL], [128], [0.0]),
    (req_(9_000, 0, 0, 0), [FULL], [128], [RARE_WEIGHT]),
])
def test_what_a_whole_gpu_or_cpu_only_pod_pays(request_: MilliRequest, free: list[list[int]],
                                               cpu: list[int], want: list[float]) -> None:
    rule = RareShapeRule.of(shapes(BIG, ONE), CLUSTER)
    model = [1 if c != 96 else 0 for c in cpu]
    got = rule.penalty_of(*_arrays(free, cpu, model), request_)
    assert got.tolist() == want


def test_what_a_share_pays_per_gpu() -> None:
    # On the G3 node with one GPU half used: a share there keeps 7 GPUs fully free (the
    # 8-GPU pod no longer fits anyway: 0), and the rare G3 share of 500 keeps a GPU with
    # 500 free on every option but the one that fills the last such GPU.
    rule = RareShapeRule.of(shapes(ONE, G3_SHARE), CLUSTER)
    free = [[500] + [0] * 7]
    got = rule.penalty_of(*_arrays(free, [128], [1]), req_(2_000, 0, 1, 300))
    assert got.shape == (1, 8)
    assert got[0, 0] == RARE_WEIGHT  # 500 -> 200: no GPU with 500 free is left
    rule = RareShapeRule.of(shapes(BIG, ONE), CLUSTER)
    got = rule.penalty_of(*_arrays([FULL], [128], [1]), req_(2_000, 0, 1, 300))
    assert got.tolist() == [[RARE_WEIGHT] * 8]  # any GPU breaks the 8 fully free ones


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.sampled_from([0, 190, 500, 810, GPU_MILLI]),
                                   min_size=8, max_size=8),
                          st.integers(0, 128), st.integers(0, 1)), min_size=1, max_size=6),
       st.sampled_from([req_(12_000, 0, 1, GPU_MILLI),
                        req_(10_000, 0, 2, GPU_MILLI), req_(3_000, 0, 1, 500),
                        req_(30_000, 0, 0, 0)]))
def test_the_price_is_what_the_node_loses(rows: list[tuple[list[int], int, int]],
                                          req: MilliRequest) -> None:
    """Against a plain per-node reading: weight exactly where the node could host a rare
    shape before the placement and cannot after it."""
    rule = RareShapeRule.of(shapes(BIG, ONE, G3_SHARE), CLUSTER)
    free, cpu, mem, model = _arrays([r[0] for r in rows], [r[1] for r in rows],
                                    [r[2] for r in rows])
    got = rule.penalty_of(free, cpu, mem, model, req)

    def hosts(f: list[int], c: int, m: int, mid: int) -> bool:
        for k in (BIG, G3_SHARE):
            ok_model = not k.gpu_spec or MODELS[mid] in k.gpu_spec
            if k.gpu_milli >= GPU_MILLI:
                gpus = sum(x == GPU_MILLI for x in f) >= k.num_gpu
            else:
                gpus = max(f) >= k.gpu_milli
            if ok_model and c >= k.cpu_milli and m >= 0 and gpus:
                return True
        return False

    for i, (f, c_cores, mid) in enumerate(rows):
        c = c_cores * 1000
        if req.shared:
            for g in range(8):
                if f[g] < req.milli:
                    continue
                after = list(f)
                after[g] -= req.milli
                lost = hosts(f, c, 0, mid) and not hosts(after, c - req.cpu, 0, mid)
                assert got[i, g] == (RARE_WEIGHT if lost else 0.0)
        else:
            after = list(f)
            taken = 0
            for g in range(8):
                if req.num_gpu and after[g] == GPU_MILLI and taken < req.num_gpu:
                    after[g], taken = 0, taken + 1
            lost = hosts(f, c, 0, mid) and not hosts(after, c - req.cpu, 0, mid)
            assert got[i] == (RARE_WEIGHT if lost else 0.0)


def _cluster() -> tuple[Snapshot, list]:  # type: ignore[type-arg]
    nodes = [node(f"n{i:02d}", cpu=96_000, mem=393_216) for i in range(23)]
    nodes.append(node("big", cpu=128_000, mem=786_432))
    pods = [whole(f"p{i}", cpu=12_000) for i in range(30)] + [
        whole("llm", count=8, cpu=120_000)]
    running = tuple((p, Placement(p.key, "n00", (0,))) for p in pods[:20])
    return Snapshot(tuple(nodes), running, tuple(pods[20:])), pods


def test_the_extenders_scorer_prices_a_rare_node() -> None:
    snap, pods = _cluster()
    scorer = make_gpupack_scorer(snap)
    assert scorer.rules.rare is not None and scorer.rules.rare.active
    # without the nodes (the scorer of a pod workload alone) the price is off
    assert GpupackScorer(workload_of(snap)).rules.rare is None
    state = ClusterState(Snapshot(snap.nodes))
    pod = pods[0]
    on_big = state.options(pod, "big")[0]
    on_small = state.options(pod, "n01")[0]
    # the one-GPU pod ranks RARE_WEIGHT lower on the 128-core node than it would
    # without the price, and not at all lower on a 96-core one
    plain = GpupackScorer(workload_of(snap))
    assert scorer.rank(state, pod, on_big) == pytest.approx(
        plain.rank(state, pod, on_big) - RARE_WEIGHT)
    assert scorer.rank(state, pod, on_small) == pytest.approx(plain.rank(state, pod, on_small))


def test_the_planner_carries_the_capacity_to_every_scorer() -> None:
    snap, pods = _cluster()
    source = pickle.loads(pickle.dumps(shape_workload(snap)))
    classes = capacity_classes(snap.nodes)
    assert sorted(c for _, c in classes) == [1, 23]
    assert rare_shapes_key(source) == rare_shapes_key(snap) != ()
    # the warm child's source, the solver's expanded workload and the snapshot itself
    # make scorers that rate every option alike
    job = SolveJob("gpupack", SolverParams(), Snapshot(snap.nodes[:2]), (pods[-1],),
                   compact_workload(source), capacity=compact_nodes(source))
    job = unpack(SnapshotPacker().pack(job))
    expanded = expand_workload(job.workload, job.capacity)
    state = ClusterState(Snapshot(snap.nodes))
    scorers = [make_gpupack_scorer(s) for s in (snap, source, expanded)]
    for pod in (pods[0], pods[-1]):
        for n in snap.nodes:
            for option in state.options(pod, n.name)[:2]:
                keys = {s(state, pod, option) for s in scorers}
                assert len(keys) == 1, (pod.key, n.name)
