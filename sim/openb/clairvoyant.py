"""A clairvoyant rolling-horizon CP-SAT run of the openb protocol: an achievable figure.

It knows the arrival order. Up to ``start`` (a fraction of the arrivals) pods are placed
by a replay policy (``gpupack``); from there on, every ``window`` arrivals CP-SAT plans
them together: each pod of the window may go to any GPU of its ``top`` best nodes for
the policy in the state before the window (shares: one GPU each; whole-GPU pods: fully
free GPUs), with cpu, memory and each GPU's compute respected and a fully free GPU
taken either by whole-GPU pods or by shares, maximising the GPU demand the window
places (then, at one 1000th of the weight, the fully free GPUs it keeps). The plan is
then carried out in arrival order under the protocol's rule: a pod goes where the plan
put it if that still fits; a pod the plan left out, or whose planned place is gone, goes
where the policy puts it if it fits anywhere (the protocol places every pod that fits),
else it fails. So the run is a legal run of the protocol, and its allocation at 130% is
achievable: the optimum lies between it and :mod:`sim.openb.bound`'s certificate.

CP-SAT: explicit time limit per window, workers and seed; FEASIBLE answers are used;
with no answer the window falls back to the policy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from packing.fragmentation import IntArray, MilliRequest, TypicalShapes
from packing.model import GPU_MILLI
from sim.openb.cluster import Nodes, Pods, ReplayState
from sim.openb.policies import ReplayPolicy, make
from sim.openb.replay import alloc_at


@dataclass(frozen=True)
class ClairvoyantRun:
    alloc_130: float
    placed: int
    failed: int
    windows: int
    planned: int  # pods placed where CP-SAT planned them
    seconds: float


def _request(pods: Pods, i: int) -> MilliRequest:
    q = int(pods.request_id[i])
    return MilliRequest(cpu=int(pods.cpu_milli[i]), mem=int(pods.memory_mib[i]),
                        num_gpu=int(pods.num_gpu[i]), milli=int(pods.gpu_milli[i]),
                        model_ok=pods.request_model_ok[q], rid=q)


def _policy_place(state: ReplayState, policy: ReplayPolicy, req: MilliRequest
                  ) -> tuple[int, tuple[int, ...]] | None:
    idx = state.feasible(req.cpu, req.mem, req.num_gpu, req.milli, req.model_ok)
    if len(idx) == 0:
        return None
    scores, gpus = policy.evaluate(idx, req)
    best = scores.max()
    ties = np.flatnonzero(scores == best)
    pick = ties[policy.break_tie(idx[ties], req)] if len(ties) > 1 else ties[0]
    node = int(idx[pick])
    if req.shared:
        return node, (int(gpus[pick]),)
    if req.num_gpu:
        return node, state.whole_gpus(node, req.num_gpu)
    return node, ()


def _fits(state: ReplayState, req: MilliRequest, node: int, gpus: tuple[int, ...]) -> bool:
    if state.free_cpu[node] < req.cpu or state.free_mem[node] < req.mem:
        return False
    if not req.model_ok[state.nodes.model_id[node]]:
        return False
    if req.shared:
        return bool(state.free_gpu[node, gpus[0]] >= req.milli)
    return all(state.free_gpu[node, g] == GPU_MILLI for g in gpus)


def _plan(state: ReplayState, policy: ReplayPolicy, pods: Pods, window: list[tuple[int, int]],
          top: int, time_limit: float, seed: int) -> dict[int, tuple[int, tuple[int, ...]]]:
    """CP-SAT's placement of ``window`` ((arrival position, pod index) pairs) from the
    current state, by arrival position (a pod of the trace may arrive more than once)."""
    m = cp_model.CpModel()
    options: dict[int, list[tuple[cp_model.IntVar, int, tuple[int, ...]]]] = {}
    nodes: set[int] = set()
    pod_of = dict(window)
    for a, i in window:
        req = _request(pods, i)
        idx = state.feasible(req.cpu, req.mem, req.num_gpu, req.milli, req.model_ok)
        if len(idx) == 0:
            continue
        scores, _ = policy.evaluate(idx, req)
        best = idx[np.argsort(-scores, kind="stable")[:top]]
        opts: list[tuple[cp_model.IntVar, int, tuple[int, ...]]] = []
        for n in best.tolist():
            nodes.add(n)
            if req.shared:
                for g in range(int(state.nodes.gpu_count[n])):
                    opts.append((m.new_bool_var(""), n, (g,)))
            elif req.num_gpu:
                opts.append((m.new_bool_var(""), n, ()))  # GPUs chosen at execution
            else:
                opts.append((m.new_bool_var(""), n, ()))
        m.add_at_most_one(v for v, _, _ in opts)
        options[a] = opts
    touched: dict[tuple[int, int], cp_model.IntVar] = {}
    for n in nodes:
        on = [(pod_of[a], v, g) for a, opts in options.items() for v, nn, g in opts if nn == n]
        m.add(sum(int(pods.cpu_milli[i]) * v for i, v, _ in on) <= int(state.free_cpu[n]))
        m.add(sum(int(pods.memory_mib[i]) * v for i, v, _ in on) <= int(state.free_mem[n]))
        fresh = [g for g in range(int(state.nodes.gpu_count[n]))
                 if state.free_gpu[n, g] == GPU_MILLI]
        for g in range(int(state.nodes.gpu_count[n])):
            shares = [(i, v) for i, v, gg in on if gg == (g,)]
            if not shares:
                continue
            m.add(sum(int(pods.gpu_milli[i]) * v for i, v in shares) <= int(state.free_gpu[n, g]))
            if g in fresh:
                t = touched[n, g] = m.new_bool_var("")
                for _, v in shares:
                    m.add_implication(v, t)
        whole = [(i, v) for i, v, gg in on if gg == () and pods.num_gpu[i] > 0]
        if whole:
            m.add(sum(int(pods.num_gpu[i]) * v for i, v in whole)
                  + sum(touched.get((n, g), 0) for g in fresh) <= len(fresh))
    placed = sum(int(pods.num_gpu[pod_of[a]] * pods.gpu_milli[pod_of[a]]) * 1000 * v
                 for a, opts in options.items() for v, _, _ in opts)
    m.maximize(placed - sum(touched.values()))
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return {}
    return {a: (n, g) for a, opts in options.items() for v, n, g in opts if solver.value(v)}


def clairvoyant_run(nodes: Nodes, pods: Pods, workload: IntArray, shapes: TypicalShapes,
                    seed: int, *, start: float = 0.6, window: int = 80, top: int = 6,
                    time_limit: float = 5.0) -> ClairvoyantRun:
    t0 = time.perf_counter()
    state = ReplayState(nodes)
    policy = make("gpupack")
    policy.reset(state, shapes, seed=seed)
    cap = nodes.gpu_capacity_milli
    demand = pods.demand_milli
    arrived = np.zeros(len(workload), dtype=np.int64)
    allocated = np.zeros(len(workload), dtype=np.int64)
    first = int(start * len(workload))
    plan: dict[int, tuple[int, tuple[int, ...]]] = {}
    windows = planned = failed = placed = 0
    total = 0
    for a, i in enumerate(workload.tolist()):
        if a >= first and (a - first) % window == 0:
            chunk = list(enumerate(workload[a:a + window].tolist(), start=a))
            plan = _plan(state, policy, pods, chunk, top, time_limit, seed)
            windows += 1
        req = _request(pods, i)
        where = plan.pop(a, None) if a >= first else None
        if where is not None and req.num_gpu and not req.shared:
            where = (where[0], state.whole_gpus(where[0], req.num_gpu))
            if len(where[1]) < req.num_gpu:
                where = None
        if where is not None and _fits(state, req, *where):
            planned += 1
        else:
            where = _policy_place(state, policy, req)
        if where is None:
            failed += 1
        else:
            state.place(where[0], req.cpu, req.mem, req.num_gpu, req.milli, where[1])
            policy.placed(where[0])
            placed += 1
        total += int(demand[i])
        arrived[a] = total
        allocated[a] = state.allocated_milli
    if (state.free_cpu < 0).any() or (state.free_mem < 0).any() or (state.free_gpu < 0).any():
        raise RuntimeError("the clairvoyant run over-committed a node: a bug")
    return ClairvoyantRun(
        alloc_130=alloc_at(100.0 * arrived / cap, 100.0 * allocated / cap, 130),
        placed=placed, failed=failed, windows=windows, planned=planned,
        seconds=time.perf_counter() - t0)
