"""The FGD paper's arrival-only replay (see ``shared/reference/performance-anchors.md``).

Workload: the whole trace plus pods drawn uniformly with replacement from it, appended
until the next draw would push total GPU demand (sum of num_gpu x gpu_milli) past
``load`` x cluster GPU capacity; then shuffled by the seed. Each pod is placed on arrival
or dropped (pods never leave). After every arrival we record the arrived GPU demand
(failed pods included) and the allocated GPU milli; "allocation at X%" is the mean
allocation ratio over the arrivals whose arrived demand, in percent of capacity and
rounded to an integer, equals X (X +/- 1 when none does).

Modes: ``online`` decides each pod alone on arrival (the paper). ``windowed`` lets the
planner see the last W arrivals still pending and decide them together, largest GPU
demand first (ties: more CPU first), when the window is full and at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from packing.fragmentation import (
    DEFAULT_COVERAGE,
    FloatArray,
    IntArray,
    MilliRequest,
    ShapeKey,
    TypicalShapes,
    fragmentation_of,
    typical_shape_table,
)
from packing.model import GPU_MILLI
from sim.openb.cluster import Nodes, Pods, ReplayState
from sim.openb.policies import ReplayPolicy

DEFAULT_LOAD = 1.3
PUBLISHED_SEEDS = tuple(range(42, 52))
KINDS = ("whole", "shared", "cpu")


def build_workload(
    pods: Pods, capacity_milli: int, seed: int, load: float = DEFAULT_LOAD
) -> IntArray:
    """Indices into ``pods`` in arrival order (the protocol's inflated, shuffled trace)."""
    rng = np.random.default_rng(seed)
    demand = pods.demand_milli
    order = list(range(len(demand)))
    total = int(demand.sum())
    limit = load * capacity_milli
    if len(demand):
        # Draw in blocks for speed; the stop rule is still applied draw by draw.
        while True:
            block = rng.integers(0, len(demand), size=1024)
            stop = False
            for i in block:
                d = int(demand[i])
                if total + d > limit:
                    stop = True
                    break
                order.append(int(i))
                total += d
            if stop:
                break
    arr = np.array(order, dtype=np.int64)
    rng.shuffle(arr)
    return arr


def trace_shapes(
    pods: Pods, models: tuple[str, ...], coverage: float = DEFAULT_COVERAGE
) -> TypicalShapes:
    """FGD's typical shapes of the *trace* (every pod once), as the published simulator
    takes them: ``SetTypicalPods`` runs on the original workload, before it is inflated
    to 130% load. Independent of the seed."""
    return workload_shapes(pods, np.arange(len(pods.pods), dtype=np.int64), models, coverage)


def workload_shapes(
    pods: Pods, workload: IntArray, models: tuple[str, ...], coverage: float = DEFAULT_COVERAGE
) -> TypicalShapes:
    """FGD's typical shapes of the workload (by default 95% of its pods by count)."""
    keys = [
        ShapeKey(
            cpu_milli=int(pods.cpu_milli[i]),
            num_gpu=int(pods.num_gpu[i]),
            gpu_milli=int(pods.gpu_milli[i]),
            gpu_spec=pods.pods[i].gpu_spec,
        )
        for i in workload
    ]
    return typical_shape_table(keys, models, coverage)


def kind_of(num_gpu: int, milli: int) -> str:
    if num_gpu == 0:
        return "cpu"
    return "whole" if milli >= GPU_MILLI else "shared"


@dataclass
class RunResult:
    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: IntArray  # after each arrival
    allocated_milli: IntArray  # after each arrival
    decision_ms: FloatArray  # per decided pod
    failed: dict[str, int] = field(default_factory=dict)
    frag_rate: dict[int, float] = field(default_factory=dict)  # load % -> frag / idle %
    # (pod index into Pods, node, GPUs) in decision order
    placements: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)

    @property
    def arrived_pct(self) -> FloatArray:
        return np.asarray(100.0 * self.arrived_milli / self.capacity_milli, dtype=np.float64)

    @property
    def alloc_pct(self) -> FloatArray:
        return np.asarray(100.0 * self.allocated_milli / self.capacity_milli, dtype=np.float64)

    def alloc_at(self, pct: int) -> float:
        return alloc_at(self.arrived_pct, self.alloc_pct, pct)

    def series(self, max_pct: int = 130) -> FloatArray:
        """Allocation % at each integer arrived load 0..max_pct (nan where none)."""
        return np.array([self.alloc_at(x) for x in range(max_pct + 1)], dtype=np.float64)


def alloc_at(arrived_pct: FloatArray, alloc_pct: FloatArray, pct: int) -> float:
    rounded = np.floor(arrived_pct + 0.5).astype(np.int64)
    for target in (pct, pct - 1, pct + 1):
        hit = rounded == target
        if hit.any():
            return float(alloc_pct[hit].mean())
    return float("nan")


class _Decider:
    """Places one request with a policy, with the per-(node, request) score cache."""

    def __init__(
        self, state: ReplayState, policy: ReplayPolicy, n_requests: int, seed: int, cache: bool
    ):
        self.state = state
        self.policy = policy
        self.rng = np.random.default_rng(seed + 7919)
        self.cache = cache and policy.cacheable
        self.generation = policy.generation
        n = state.nodes.size
        self.score = np.zeros((n, n_requests), dtype=np.float64)
        self.gpu = np.full((n, n_requests), -1, dtype=np.int64)
        self.stamp = np.full((n, n_requests), -1, dtype=np.int64)

    def decide(self, req: MilliRequest) -> tuple[int, tuple[int, ...]] | None:
        """Place ``req``; its (node, GPUs), or None when no node can host it."""
        st = self.state
        idx = st.feasible(req.cpu, req.mem, req.num_gpu, req.milli, req.model_ok)
        if len(idx) == 0:
            return None
        if self.cache:
            if self.policy.generation != self.generation:
                self.stamp.fill(-1)  # the policy's scores changed everywhere
                self.generation = self.policy.generation
            q = req.rid
            dirty = idx[self.stamp[idx, q] != st.version[idx]]
            if len(dirty):
                s, g = self.policy.evaluate(dirty, req)
                self.score[dirty, q] = s
                self.gpu[dirty, q] = g
                self.stamp[dirty, q] = st.version[dirty]
            scores, gpus = self.score[idx, q], self.gpu[idx, q]
        else:
            scores, gpus = self.policy.evaluate(idx, req)
        best = scores.max()
        ties = np.flatnonzero(scores == best)
        if len(ties) == 1:
            pick = ties[0]
        elif self.policy.random_ties:
            pick = ties[self.rng.integers(len(ties))]
        else:
            pick = ties[self.policy.break_tie(idx[ties], req)]
        node = int(idx[pick])
        if req.shared:
            gpu_ids: tuple[int, ...] = (int(gpus[pick]),)
        elif req.num_gpu > 0:
            gpu_ids = st.whole_gpus(node, req.num_gpu)
        else:
            gpu_ids = ()
        st.place(node, req.cpu, req.mem, req.num_gpu, req.milli, gpu_ids)
        self.policy.placed(node)
        return node, gpu_ids


def replay(
    nodes: Nodes,
    pods: Pods,
    workload: IntArray,
    policy: ReplayPolicy,
    seed: int,
    shapes: TypicalShapes,
    all_shapes: TypicalShapes | None = None,
    mode: str = "online",
    window: int = 1,
    cache: bool = True,
    frag_points: tuple[int, ...] = (85, 100, 130),
    progress: Callable[[int, int], None] | None = None,
) -> RunResult:
    """Replay ``workload`` (indices into ``pods``) through ``policy``."""
    if mode not in ("online", "windowed"):
        raise ValueError(f"unknown mode {mode!r}")
    state = ReplayState(nodes)
    policy.reset(state, shapes, all_shapes, seed=seed)
    decider = _Decider(state, policy, len(pods.requests), seed, cache)
    cap = nodes.gpu_capacity_milli
    n = len(workload)
    arrived = np.zeros(n, dtype=np.int64)
    allocated = np.zeros(n, dtype=np.int64)
    times: list[float] = []
    failed = dict.fromkeys(KINDS, 0)
    frag_rate: dict[int, float] = {}
    pending_points = sorted(frag_points)
    w = window if mode == "windowed" else 1
    buffer: list[int] = []
    placements: list[tuple[int, int, tuple[int, ...]]] = []
    demand = pods.demand_milli
    total_arrived = 0

    def request(i: int) -> MilliRequest:
        q = int(pods.request_id[i])
        return MilliRequest(
            cpu=int(pods.cpu_milli[i]),
            mem=int(pods.memory_mib[i]),
            num_gpu=int(pods.num_gpu[i]),
            milli=int(pods.gpu_milli[i]),
            model_ok=pods.request_model_ok[q],
            rid=q,
        )

    def flush() -> None:
        if not buffer:
            return
        # Largest GPU demand first, then most CPU: big pods get the clean space.
        batch = sorted(buffer, key=lambda i: (-int(demand[i]), -int(pods.cpu_milli[i])))
        t0 = time.perf_counter()
        for i in batch:
            r = request(i)
            where = decider.decide(r)
            if where is None:
                failed[kind_of(r.num_gpu, r.milli)] += 1
            else:
                placements.append((i, where[0], where[1]))
        per = (time.perf_counter() - t0) * 1000.0 / len(batch)
        times.extend([per] * len(batch))
        buffer.clear()

    for a, i in enumerate(workload):
        total_arrived += int(demand[i])
        buffer.append(int(i))
        if len(buffer) >= w:
            flush()
        if a == n - 1:
            flush()
        arrived[a] = total_arrived
        allocated[a] = state.allocated_milli
        while pending_points and total_arrived * 100.0 / cap >= pending_points[0] - 0.5:
            frag_rate[pending_points.pop(0)] = cluster_frag_rate(state, shapes)
        if progress is not None and a % 2000 == 0:
            progress(a, n)
    for p in pending_points:
        frag_rate[p] = cluster_frag_rate(state, shapes)
    return RunResult(
        policy=policy.name,
        seed=seed,
        capacity_milli=cap,
        arrived_milli=arrived,
        allocated_milli=allocated,
        decision_ms=np.array(times, dtype=np.float64),
        failed=failed,
        frag_rate=frag_rate,
        placements=placements,
    )


def cluster_frag_rate(state: ReplayState, shapes: TypicalShapes) -> float:
    """Cluster fragment as a percentage of idle GPU capacity (FGD's fragmentation rate)."""
    idle = float(state.free_gpu.sum())
    if idle <= 0:
        return 0.0
    frag = fragmentation_of(
        state.free_gpu, state.free_cpu, state.free_mem, state.nodes.model_id, shapes
    )
    return float(100.0 * frag.sum() / idle)
