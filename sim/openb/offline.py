"""Offline upper bound on GPU allocation for one workload (all pods known in advance).

Nodes with identical (cpu, memory, GPU count, model) form a type t with n_t nodes;
pods with identical requests form a class q with c_q pods. Integer x[q, t] = pods of
class q on nodes of type t, subject to, per type, the summed CPU, memory, GPU compute and
(for whole-GPU pods) GPU count not exceeding n_t times one node's, and x[q, .] <= c_q.
Maximise sum x[q, t] * demand_q. Pooling a type's nodes relaxes per-node and per-GPU
packing, so the optimum (or CP-SAT's proven bound when time runs out) is an upper bound
on what any placement, online or offline, can allocate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ortools.sat.python import cp_model

from packing.fragmentation import IntArray
from packing.model import GPU_MILLI
from sim.openb.cluster import Nodes, Pods


@dataclass(frozen=True)
class OfflineBound:
    alloc_pct: float  # upper bound on allocated GPU capacity, % of capacity
    status: str  # CP-SAT status name
    demand_pct: float  # GPU demand of the workload, % of capacity


def offline_bound(
    nodes: Nodes,
    pods: Pods,
    workload: IntArray,
    max_time_in_seconds: float = 20.0,
    num_workers: int = 2,
    random_seed: int = 0,
) -> OfflineBound:
    types: dict[tuple[int, int, int, int], int] = Counter(
        zip(
            nodes.cpu_milli.tolist(),
            nodes.memory_mib.tolist(),
            nodes.gpu_count.tolist(),
            nodes.model_id.tolist(),
            strict=True,
        )
    )
    classes = Counter(int(pods.request_id[i]) for i in workload)
    model = cp_model.CpModel()
    x: dict[tuple[int, tuple[int, int, int, int]], cp_model.IntVar] = {}
    for q, count in classes.items():
        cpu, mem, k, _, _ = pods.requests[q]
        for t in types:
            tcpu, tmem, tgpu, tmodel = t
            # the class must fit on one node of the type, alone
            if not pods.request_model_ok[q, tmodel] or cpu > tcpu or mem > tmem or k > tgpu:
                continue
            x[q, t] = model.new_int_var(0, count, f"x_{q}_{t}")
    for t, n in types.items():
        tcpu, tmem, tgpu, _ = t
        on_t = [(q, v) for (q, tt), v in x.items() if tt == t]
        if not on_t:
            continue
        model.add(sum(v * pods.requests[q][0] for q, v in on_t) <= n * tcpu)
        model.add(sum(v * pods.requests[q][1] for q, v in on_t) <= n * tmem)
        model.add(
            sum(v * pods.requests[q][2] * pods.requests[q][3] for q, v in on_t)
            <= n * tgpu * GPU_MILLI
        )
        whole = [(q, v) for q, v in on_t if pods.requests[q][3] >= GPU_MILLI]
        if whole:
            model.add(sum(v * pods.requests[q][2] for q, v in whole) <= n * tgpu)
    for q, count in classes.items():
        vs = [v for (qq, _), v in x.items() if qq == q]
        if vs:
            model.add(sum(vs) <= count)
    model.maximize(sum(v * pods.requests[q][2] * pods.requests[q][3] for (q, _), v in x.items()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max_time_in_seconds
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = random_seed
    status = solver.solve(model)
    cap = nodes.gpu_capacity_milli
    bound = solver.best_objective_bound if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else cap
    demand = float(pods.demand_milli[workload].sum())
    return OfflineBound(
        alloc_pct=100.0 * min(bound, cap) / cap,
        status=solver.status_name(status),
        demand_pct=100.0 * demand / cap,
    )
