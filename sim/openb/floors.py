"""Floors under the openb certificate: how far two ways of tightening its relaxation can
bring it down, measured from one run of the protocol (issue 38, item 2).

The certificate of :mod:`sim.openb.bound` stopped moving on multigpu40 and gpushare40.
There are two ways to tighten a relaxation like it:

* **Integral blocking.** Branch and bound on the blocking variables b. A run is a
  point of the LP with b fixed to its profile (:func:`blocking_profile`): class q
  blocked at slice k iff one of its pods failed before g_k, or a class that dominates
  it is blocked. Those facts hold in the run. Where the profile says 0, the class may
  in truth be blocked already (no pod of it arrived since), but b = 0 only asks that
  every pod of it arrived so far be placed, which the run did. (Other profiles fit the
  same run too, for example one that counts a failure at g_k as blocked at slice k;
  each gives a floor of its own, and this one is a floor like any.) Branch and bound,
  at any budget and with these slices, keeps a node whose fixings hold this profile.
  That node's LP contains the profile's LP, and so does every ancestor's, so its
  figure (the smaller of its own certificate and its parent's) is at least the
  **blocking floor**: the optimum of the relaxation with b fixed to the profile. The
  result is the largest figure left, so it is never below the floor.
* **Per-node end states.** Column generation over node configurations. A configuration
  c of type t is a multiset of pods that fits one node of t: cpu, memory, whole GPUs,
  and shares packed per GPU. The rows added are

      X_end,t,q <= sum_c n_c,q lam_t,c,    sum_c lam_t,c <= N_t,    lam >= 0.

  They hold for every run (lam_t,c counts t's nodes that end in c). Given every
  configuration, that LP is the one column generation solves. Its Lagrangian
  certificate is at least its optimum, and a subset of the columns can only lower a
  maximum. So the LP restricted to the run's own configurations, the
  **configuration floor**, is a floor for it.

``both`` fixes the profile and restricts the end state to the run's configurations. It
is a floor for branch and bound with column generation at these slices.

Each floor is an LP optimum, not a certificate. Each lies between the run's own
allocation (the run is a point of every LP here) and the root's LP optimum. A floor
close to the root says that direction cannot move the certificate, whatever the
budget.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packing.fragmentation import BoolArray, IntArray
from sim.openb.bound import MAJOR, SLICES, Instance, SlicedModel, build, dominates, slice_ends

# A placement as the replay records it: (pod index, node, GPU indices)
Placement = tuple[int, int, tuple[int, ...]]


@dataclass(frozen=True)
class RunEnd:
    """What one run of the protocol fixes: which arrivals (up to the cut) it placed, and
    each node's end state as pods per class."""

    placed: BoolArray  # [n_arrivals]
    configs: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # per node: (type, ((q, pods)))


def arrival_classes(inst: Instance) -> IntArray:
    """[n_arrivals]: each arrival's class."""
    cls = np.full(inst.n_arrivals, -1, dtype=np.int64)
    for q, pos in enumerate(inst.positions):
        cls[pos] = q
    return cls


def run_end(inst: Instance, workload: IntArray, placements: Sequence[Placement]) -> RunEnd:
    """The :class:`RunEnd` of a run over ``workload`` (pod indices in arrival order, as
    given to the replay). ``placements`` are the run's, in arrival order; those past the
    cut do not count."""
    n = inst.n_arrivals
    if len(workload) < n:
        raise ValueError(f"workload has {len(workload)} arrivals, the instance's cut is {n}")
    cls = arrival_classes(inst)
    nodes = len(inst.node_type)
    placed = np.zeros(n, dtype=np.bool_)
    per_node: list[Counter[int]] = [Counter() for _ in range(nodes)]
    p = 0
    for j in range(n):
        if p < len(placements) and placements[p][0] == int(workload[j]):
            node = int(placements[p][1])
            if not 0 <= node < nodes:
                raise ValueError(f"placement {p}: node {node} is not one of {nodes} nodes")
            if not inst.ok[cls[j], inst.node_type[node]]:
                raise ValueError(f"placement {p}: pod {placements[p][0]} does not fit node"
                                 f" {node} even when it is empty")
            placed[j] = True
            per_node[node][int(cls[j])] += 1
            p += 1
    for j in range(n, len(workload)):  # past the cut: only checked for order
        if p < len(placements) and placements[p][0] == int(workload[j]):
            p += 1
    if p < len(placements):
        raise ValueError(f"placement {p} (pod {placements[p][0]}) is not an arrival of the"
                         " workload in order")
    configs = tuple((int(inst.node_type[m]), tuple(sorted(per_node[m].items())))
                    for m in range(nodes))
    return RunEnd(placed, configs)


def blocking_profile(inst: Instance, placed: BoolArray, slices: Sequence[float] = SLICES
                     ) -> dict[tuple[int, int], bool]:
    """Per (slice, class): blocked at that slice in the run that placed ``placed`` (module
    docstring): a pod of the class failed before the slice's arrival count, or a class
    that dominates it (:func:`sim.openb.bound.dominates`) is blocked."""
    gs = slice_ends(inst.n_arrivals, slices)
    total = inst.total()
    tracked = [q for q in range(inst.n_classes) if total[q] > 0]
    first = {q: next((int(j) for j in inst.positions[q] if not placed[j]), inst.n_arrivals)
             for q in tracked}
    below = {q: [q2 for q2 in tracked if q2 != q and dominates(inst, q, q2)] for q in tracked}
    blocked = {(k, q): first[q] < g for k, g in enumerate(gs) for q in tracked}
    # dominance is transitive (inclusion of the sets of nodes that reject), so one pass
    # would do; the worklist does not rely on it
    for k in range(len(gs)):
        todo = [q for q in tracked if blocked[k, q]]
        while todo:
            q = todo.pop()
            for q2 in below[q]:
                if not blocked[k, q2]:
                    blocked[k, q2] = True
                    todo.append(q2)
    return blocked


@dataclass(frozen=True)
class Floors:
    """A run's allocation at the cut and the LP optima of the module docstring, % of GPU
    capacity (NaN where the LP ended without an optimum)."""

    run: float
    root: float
    blocking: float
    configurations: float
    both: float
    configs: int  # distinct node configurations of the run
    seconds: float

    def to_json(self) -> dict[str, float | int]:
        return {"run": round(self.run, 4), "root": round(self.root, 4),
                "blocking": round(self.blocking, 4),
                "configurations": round(self.configurations, 4),
                "both": round(self.both, 4), "configs": self.configs,
                "seconds": round(self.seconds, 1)}


def _optimum(model: SlicedModel, what: str) -> float:
    """The LP's optimum, % of capacity; NaN when GLOP ends without an answer (its time
    limit). Infeasible is an error: the run is a point of every LP here."""
    status = model.lp.solve()
    if status == "infeasible":
        raise RuntimeError(f"the {what} LP is infeasible although the run is a point of"
                           " it: a bug in the profile, the configurations or the model")
    if status != "optimal":
        return math.nan
    return 100.0 * model.lp.value() / float(model.inst.capacity_milli)


def _fix_profile(model: SlicedModel, blocked: dict[tuple[int, int], bool]) -> None:
    """Every b to the profile's 0 or 1."""
    for (k, q), j in model.b.items():
        model.lp.set_bounds(j, float(blocked[k, q]), float(blocked[k, q]))


def _free_blocking(model: SlicedModel) -> None:
    """Every b back to [0, 1]."""
    for j in model.b.values():
        model.lp.set_bounds(j, 0.0, 1.0)


def _add_configurations(model: SlicedModel, end: RunEnd) -> int:
    """The rows of the module docstring over the run's configurations; their count."""
    lp, inst = model.lp, model.inst
    link = {tq: lp.row(-lp.inf, 0.0, [(j, 1.0)]) for tq, j in model.x_last.items()}
    conv = {t: lp.row(-lp.inf, float(inst.type_count[t]), []) for t in range(inst.n_types)}
    seen = set(end.configs)
    for t, pods in sorted(seen):
        lp.column(0.0, float(inst.type_count[t]), 0.0,
                  [(conv[t], 1.0)] + [(link[t, q], -float(c)) for q, c in pods])
    return len(seen)


def floors(inst: Instance, end: RunEnd, slices: Sequence[float] = SLICES,
           major: float = MAJOR) -> Floors:
    """The floors of the run ``end`` (module docstring), with the relaxation's ``slices``
    and ``major`` threshold (those of the certificate they speak of)."""
    t0 = time.perf_counter()
    cls = arrival_classes(inst)
    run = 100.0 * float(inst.demand[cls[end.placed]].sum()) / float(inst.capacity_milli)
    model = build(inst, slices, major)
    root = _optimum(model, "root")
    _fix_profile(model, blocking_profile(inst, end.placed, slices))
    blocking = _optimum(model, "blocking")
    count = _add_configurations(model, end)
    both = _optimum(model, "both")
    _free_blocking(model)
    configurations = _optimum(model, "configurations")
    return Floors(run, root, blocking, configurations, both, count,
                  time.perf_counter() - t0)
