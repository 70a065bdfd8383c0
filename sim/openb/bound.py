"""An upper bound on GPU allocation under the openb protocol (issue 38, item 1).

The protocol (:mod:`sim.openb.replay`): pods arrive in a fixed order; each is placed on
arrival if it fits on some node (the policy only chooses where), never moved, never
removed; allocation is read once the arrived GPU demand reaches 130% of capacity. The
bound holds for every policy that obeys this, clairvoyant ones included: it is a
**certificate** (a proven upper bound), computed from the dual of a linear relaxation,
so it does not depend on the LP solver's accuracy. It is not an achievable figure:
``bench/openb_bound.py`` compares it with a clairvoyant CP-SAT run.

Symbols. Node types t (identical cpu, memory, GPU count G_t and GPU model; N_t nodes);
pod classes q (identical requests: cpu c_q, memory r_q, k_q GPUs of m_q milli each,
allowed models; demand d_q = k_q m_q). Arrivals are cut at the last one whose arrived
load still rounds to the load the protocol reads (130%): allocation only grows, so what
is placed by then bounds the figure. Slices g_0 < ... < g_K-1 = the cut (fractions of
the arrivals, ``SLICES``); A_q(k) = pods of class q among the first g_k arrivals.

**Why the protocol leaves room above 100% - ever less.** Free resources only shrink, so
once no node fits class q (q is *blocked*) it stays blocked, and the pods of q that are
placed are exactly those that arrive before. Node n rejects q iff q's model is not
allowed there, or free cpu < c_q, or free memory < r_q, or (a share) every GPU has less
than m_q free, or (whole GPUs) fewer than k_q GPUs are fully free.

**The relaxation** (variables >= 0; b_k,q in [0, 1] relaxes "q blocked at slice k"):

* X_k,t,q: pods of q on type t among the first g_k arrivals; nondecreasing in k,
  sum_t X_k,t,q <= A_q(k).
* End state per type: cpu and memory pooled over the type's nodes; whole GPUs plus the
  GPUs holding shares H_t <= N_t G_t; pods of more than G_t/(j+1) GPUs at most j a node;
  the shares of all types packed into sum_t H_t GPUs exactly per GPU (an arc flow over
  0..1000 milli in steps of 10: every share size of the traces is a multiple of 10).
* Touched GPUs U_k,t: at most the GPUs of the pods placed, at least their milli / 1000,
  nondecreasing; whole GPUs taken after slice k <= N_t G_t - U_k,t (they were untouched).
* Must-place, every class: not blocked at slice k => all its arrivals so far placed,
  sum_t X_k,t,q >= A_q(k) (1 - b_k,q); blocked => none after: sum_t X_end,t,q <=
  A_q(k) + (A_q - A_q(k)) (1 - b_k,q); b nondecreasing in k; b_k,q <= b_k,q' whenever
  every node that rejects q rejects q' (:func:`dominates`). With f_j = b_j,q - b_j-1,q
  the share of runs that first block at slice j, placed by slice k >= sum_{1<=j<=k}
  f_j A_q(j-1) + (1 - b_k,q) A_q(k) and <= f_0 A_q(0) + sum_{1<=j<=k} f_j A_q(j) + (1 -
  b_k,q) A_q(k) (:func:`_first_blocking`: the same facts for 0/1 b; for fractional b the
  rows above take only the tightest slice, these the expectation over the first
  blocking slice, and imply them, so the LP carries must-place in this form only;
  2026-12-07, seed 42, coarse slices: gpushare40's root 97.24 -> 96.66, multigpu50's
  99.22 -> 98.85).
* Counts of dominated classes (:func:`_dominated_counts`, 2026-12-07): the pods of a
  class placed by the cut are a prefix of its arrivals, and when q's (n+1)-th pod fails
  every class q dominates fails from then on, so the pods placed of those classes are
  at most the ones that arrived before it: a step function of n, whose least concave
  majorant gives rows over X_end (each class against all the GPU classes it dominates
  weighted by demand, and per kind; a major class against each major class it
  dominates). They forbid what the LP did at the node that decided multigpu40 (seed 42):
  place 71% of the 810-milli pods and 76% of a whole-GPU class they dominate. Coarse
  roots, seed 42: multigpu40 98.57 -> 97.72, gpushare40 96.66 -> 95.18, default 96.66
  (98.28 before these rows and the first-blocking ones; ``bench/README.md``).
* Blocking, for the major classes (``MAJOR``: >= 3% of the demand or of the cpu):
  blocked at slice k => each node of each allowed type is short of cpu, of memory or of
  GPUs for q; at the last slice too (blocked at the end => each node short for q in the
  end state; without it b at the last slice was free, and with it the must-place of the
  arrivals after the slice before). With z^C + z^M + z^G = N_t b_k,q nodes in each state,
  the type's usage at slice k covers the states (cpu used >= (cpu_t - c_q + 1) z^C,
  memory likewise; a share: U_k,t >= G_t z^G and milli used >= G_t (1001 - m_q) z^G;
  whole GPUs: U_k,t >= (G_t - k_q + 1) z^G), counting what each state's pods bring of
  the other resources (:class:`LeastMix`: the pods of a node short of memory carry at
  least s_cm cpu per MiB of it, s_cm the least cpu per MiB of the classes allowed on
  the type, so cpu used >= (cpu_t - c_q + 1) z^C + s_cm (mem_t - r_q + 1) z^M + s_cg
  g_q z^G, g_q the milli a node short of GPUs holds; memory likewise. Without these
  terms the same pods' cpu counted toward the nodes short of cpu and their memory
  toward those short of memory. On gpushare100, seed 42, blocking the 32-core CPU-only
  class by 40% of the arrivals needs ~71k cores used if every node is short of cpu,
  against the 50k arrived by then; the LP made up the rest with nodes short of memory,
  from the same pods. That branch is now infeasible. The terms moved no openb figure:
  the LP blocks those classes fractionally, or later, at the same optimum), and what is placed
  after slice k (before the last) fits in what each state leaves:
  cpu after <= (c_q - 1) z^C + cpu_t (z^M + z^G), memory likewise, and whole GPUs after
  only on nodes whose state admits the pod (short of cpu: pods asking < c_q; of memory:
  < r_q; of GPUs: fewer than k_q GPUs, none for a share), G_t per node, k_q - 1 per
  node short of whole GPUs.

Every run of the protocol gives a feasible point (b the 0/1 blocking indicators, the
states a node-by-node choice), so the LP optimum bounds its allocation. What it relaxes:
cpu and memory pooled within a type; share packing pooled across types; b fractional
(a class partly blocked); blocking of minor classes only through dominance; no
migration only through monotone counts.

**Branch and bound** (:func:`allocation_bound`, ``budget`` > 1) tightens b: a node fixes,
for some major classes, an interval of slices in which the class first blocks; its two
children split the interval at a fractional b_k,q ("blocked by slice k" / "not yet at
slice k"), which together hold every run the node holds. A node's figure is the smaller of
its own certificate and its parent's (its LP is the parent's with bounds tightened, so
both bound its runs), and the result is the largest figure among the nodes left open and
the leaves (b integral for every major class): a certificate at any budget, never above
the root's, and never above a smaller budget's (best first and deterministic: the larger
budget runs the smaller one's steps first). It branches on the class whose pods the
node's LP leaves unplaced most (weighted by their GPU milli; a CPU-only class's cpu at the
cluster's milli per cpu), at its most fractional slice: the diagnosis of issue 38 (seed
42 of default and multigpu50) found the root's excess there: b = 0.35-0.41 for every GPU
class from the first slice on (through dominance), which lifts must-place for as large a
part of their arrivals, and the LP leaves half the 810- and 470-milli shares unplaced
and fills their GPUs with whole-GPU pods; a branch on the 810-milli class removes most of
it. (Branching on the most fractional b alone spends its LPs on classes that move
nothing: the CPU-only ones.) A class whose branch left both children's certificates
where the node's was (a pseudo-cost of zero, ``STALL``) is branched on again only where
no other major class is fractional: seed 42 at 9 LPs spent the last two LPs of
multigpu20, 30, 40 and 50 so, and a larger budget would have spent more.

**Where the interval is split** (``split``). The class's first blocking slice f lies in
the node's interval [lo, hi] (hi = K: never blocked); ANY m with lo <= m < hi gives two
children, f <= m and f >= m + 1, that together hold every run the node holds (each run
has one f), so every rule is a certificate; the rule only decides which LPs the budget
buys. "fractional" (the default) splits at the most fractional b_m: with
``FINE_SLICES`` the LP spreads b evenly over the interval and the split peels one slice
off it, so the open node that decides the figure (seed 42: the 810-milli class first
blocks between 70% and 93% on multigpu50, between 65% and 93% on gpushare40) is never
split within 9 LPs and the fine figure ends above the coarse one. "middle" splits at the
middle slice of the run of fractional b_m (b is nondecreasing, so they are contiguous;
both children cut the node's LP point off, as with the other rule): each branch halves
the interval (``bench/README.md``: gpushare40 95.82 -> 95.49 at 9 LPs; not better
everywhere, so the default stays).

**Slices.** Any increasing set of slices gives a valid relaxation (every row above holds at
every arrival count). Adding slices only tightens it: the LP of a set of slices is the
projection of the LP of any superset onto its slices' variables, restricted (each of its
rows is a row of the superset's LP, or follows from the superset's chains X_k <= X_k+1,
b_k <= b_k+1, U_k <= U_k+1). What finer slices remove: a class first blocked between
g_k-1 and g_k may, in the LP, leave every pod of it arriving in that interval unplaced,
although a run places those that arrive before the moment it blocks; with the interval cut
in three, the branch has to say in which third it blocks, and the blocking rows at the
earlier slices make the early thirds expensive (issue 38, default seed 42: the branch
"the 810-milli class first blocks in 60-75%", 97.11 with ``SLICES``, is at most 96.84
with 0.65 and 0.7 added: 91.12 / 96.48 / 96.84 for its three parts).

Past 600 lines because the relaxation, its certified LP and the branch and bound are one
argument of validity, kept beside the code it speaks of.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.linear_solver import pywraplp

from packing.fragmentation import BoolArray, FloatArray, IntArray
from packing.model import GPU_MILLI
from sim.openb.cluster import Nodes, Pods

SLICES = (0.6, 0.75, 0.85, 0.93, 1.0)
# Finer slices where the heavy share classes first block (``bench/openb_bound.py --slices
# fine``): tighter, never looser (:func:`build`), and slower (``bench/README.md``).
FINE_SLICES = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.93, 1.0)
# Slices before 0.6 (``--slices early``): with the coarse ones, a class first blocked by
# 0.6 may leave any of its pods that arrived before unplaced; on gpushare100 the LP blocks
# the 810-milli class so from the first slice on and places 1,985 of them against the
# 2,793 of gpupack's run. Early slices make branch and bound say when it blocks; the
# branches show which runs hold the certificate up (``bench/README.md``, 2026-12-07).
EARLY_SLICES = (0.4, 0.45, 0.5, 0.55, *SLICES)
MAJOR = 0.03
# A branch that lowers neither child's certificate by more than this share of capacity
# has not moved the bound (:func:`allocation_bound` demotes its class).
STALL = 1e-6
UNIT = 10  # share sizes are multiples of 10 milli in every openb trace (make_instance checks)


# --- one trace and seed -----------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Instance:
    """Node types and pod classes of one workload, cut at the protocol's load."""

    type_cpu: IntArray  # [T]
    type_mem: IntArray
    type_gpus: IntArray
    type_count: IntArray
    cls_cpu: IntArray  # [Q]
    cls_mem: IntArray
    cls_gpus: IntArray
    cls_milli: IntArray
    ok: BoolArray  # [Q, T]: q fits an empty node of type t (model, cpu, memory, GPUs)
    positions: tuple[IntArray, ...]  # per class, its arrival positions (sorted)
    n_arrivals: int  # after the cut
    capacity_milli: int
    node_type: IntArray  # [nodes]: each node's type (the runs' end states per type)

    @property
    def n_types(self) -> int:
        return len(self.type_cpu)

    @property
    def n_classes(self) -> int:
        return len(self.cls_cpu)

    @property
    def demand(self) -> IntArray:
        return np.asarray(self.cls_gpus * self.cls_milli, dtype=np.int64)

    @property
    def shared(self) -> BoolArray:
        return np.asarray((self.cls_milli > 0) & (self.cls_milli < GPU_MILLI), dtype=np.bool_)

    @property
    def whole(self) -> BoolArray:
        return np.asarray(self.cls_milli >= GPU_MILLI, dtype=np.bool_)

    def arrived(self, g: int) -> IntArray:
        """A_q: pods of each class among the first ``g`` arrivals."""
        return np.array([int(np.searchsorted(p, g)) for p in self.positions], dtype=np.int64)

    def total(self) -> IntArray:
        return np.array([len(p) for p in self.positions], dtype=np.int64)


def protocol_cut(demand: IntArray, capacity_milli: int, load_pct: int = 130) -> int:
    """Arrivals that can count towards the allocation the protocol reads at ``load_pct``
    (:func:`sim.openb.replay.alloc_at`: the arrivals whose arrived load rounds to it, else
    to one point below, else above): up to the last of them."""
    pct = np.floor(100.0 * np.cumsum(demand) / capacity_milli + 0.5).astype(np.int64)
    for target in (load_pct, load_pct - 1, load_pct + 1):
        hit = np.flatnonzero(pct == target)
        if len(hit):
            return int(hit[-1]) + 1
    return len(demand)


def make_instance(nodes: Nodes, pods: Pods, workload: IntArray,
                  load_pct: int = 130) -> Instance:
    """The instance of ``workload`` (indices into ``pods``, in arrival order)."""
    cut = protocol_cut(pods.demand_milli[workload], nodes.gpu_capacity_milli, load_pct)
    workload = workload[:cut]
    keys = list(zip(nodes.cpu_milli.tolist(), nodes.memory_mib.tolist(),
                    nodes.gpu_count.tolist(), nodes.model_id.tolist(), strict=True))
    types = sorted(set(keys))
    rid = pods.request_id[workload]
    used = sorted(set(rid.tolist()))
    req = [pods.requests[q] for q in used]
    milli = np.array([r[3] for r in req], dtype=np.int64)
    shares = milli[(milli > 0) & (milli < GPU_MILLI)]
    if np.any(shares % UNIT):
        raise ValueError(f"share sizes must be multiples of {UNIT} milli: {sorted(set(shares))}")
    cls_cpu = np.array([r[0] for r in req], dtype=np.int64)
    cls_mem = np.array([r[1] for r in req], dtype=np.int64)
    cls_gpus = np.array([r[2] for r in req], dtype=np.int64)
    t_cpu, t_mem, t_gpus, t_model = (np.array([t[i] for t in types], dtype=np.int64)
                                     for i in range(4))
    model_ok = pods.request_model_ok[np.array(used, dtype=np.int64)][:, t_model]
    ok = (model_ok & (cls_cpu[:, None] <= t_cpu[None, :]) & (cls_mem[:, None] <= t_mem[None, :])
          & (cls_gpus[:, None] <= t_gpus[None, :]))
    return Instance(
        type_cpu=t_cpu, type_mem=t_mem, type_gpus=t_gpus,
        type_count=np.array([keys.count(t) for t in types], dtype=np.int64),
        cls_cpu=cls_cpu, cls_mem=cls_mem, cls_gpus=cls_gpus, cls_milli=milli,
        ok=np.asarray(ok, dtype=np.bool_),
        positions=tuple(np.flatnonzero(rid == q).astype(np.int64) for q in used),
        n_arrivals=len(workload), capacity_milli=nodes.gpu_capacity_milli,
        node_type=np.array([types.index(k) for k in keys], dtype=np.int64))


def dominates(inst: Instance, q: int, q2: int) -> bool:
    """Whether every node state that rejects class q also rejects class q2: q2 asks at
    least as much cpu and memory, may run on no type q may not, and needs GPUs that a
    node short of them for q cannot give (a share of at least q's size or whole GPUs
    after a share; at least as many whole GPUs after whole GPUs; anything after a
    CPU-only class, which only cpu or memory block)."""
    if np.any(inst.ok[q2] & ~inst.ok[q]):
        return False
    if inst.cls_cpu[q2] < inst.cls_cpu[q] or inst.cls_mem[q2] < inst.cls_mem[q]:
        return False
    k, m = int(inst.cls_gpus[q]), int(inst.cls_milli[q])
    k2, m2 = int(inst.cls_gpus[q2]), int(inst.cls_milli[q2])
    if k == 0:
        return True
    if k2 == 0:
        return False
    if m < GPU_MILLI:
        return m2 >= m
    return m2 >= GPU_MILLI and k2 >= k


# --- an LP kept in our own hands, so that its dual bound can be checked ----------------


class CertifiedLP:
    """A maximisation LP: variables with finite bounds, rows lo <= a.x <= hi. After
    :meth:`solve`, :meth:`dual_bound` evaluates, for the solver's row duals y, the weak
    duality bound  sum_i max_{s in [lo_i, hi_i]} y_i s + sum_j max_{x_j in [l_j, u_j]}
    (c_j - a_j.y) x_j,  an upper bound on the optimum for ANY y (an infinite side is
    never chosen: its dual is dropped, which keeps the bound valid)."""

    def __init__(self) -> None:
        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:  # pragma: no cover - GLOP ships with every OR-Tools wheel
            raise RuntimeError("OR-Tools has no GLOP solver")
        self.solver = solver
        self.inf = solver.infinity()
        self.vars: list[pywraplp.Variable] = []
        self.obj: list[float] = []
        self.cols: list[list[tuple[int, float]]] = []
        self.rows: list[pywraplp.Constraint] = []
        self.lo: list[float] = []
        self.hi: list[float] = []

    def var(self, lb: float, ub: float, obj: float = 0.0) -> int:
        if not (math.isfinite(lb) and math.isfinite(ub)):
            raise ValueError("certified LP variables need finite bounds")
        v = self.solver.NumVar(lb, ub, "")
        self.solver.Objective().SetCoefficient(v, obj)
        self.vars.append(v)
        self.obj.append(obj)
        self.cols.append([])
        return len(self.vars) - 1

    def row(self, lo: float, hi: float, terms: Sequence[tuple[int, float]]) -> int:
        c = self.solver.Constraint(lo, hi)
        i = len(self.rows)
        for j, a in terms:
            if a:
                c.SetCoefficient(self.vars[j], a)
                self.cols[j].append((i, a))
        self.rows.append(c)
        self.lo.append(lo)
        self.hi.append(hi)
        return i

    def column(self, lb: float, ub: float, obj: float,
               terms: Sequence[tuple[int, float]]) -> int:
        """A variable added to rows that exist already (``terms``: row, coefficient)."""
        j = self.var(lb, ub, obj)
        for i, a in terms:
            if a:
                self.rows[i].SetCoefficient(self.vars[j], a)
                self.cols[j].append((i, a))
        return j

    def set_bounds(self, j: int, lb: float, ub: float) -> None:
        self.vars[j].SetBounds(lb, ub)

    def solve(self, time_limit: float = 1800.0) -> str:
        """"optimal", "infeasible" (proven) or "unknown" (anything else). The time limit
        leaves room for the slowest roots: gpuspec25 seed 42 with the dominated-count rows
        takes 1,018-1,040 s in the primal simplex (the dual simplex had not ended after 19
        minutes). gpuspec33 seed 44 ends without an optimum at 600 s and at 1,800 s alike
        (not resolved; its certificate stays the older root's). GLOP's presolve
        can end in ABNORMAL on these LPs (gpuspec20, seed 46); then it solves once more
        without presolve, and if that ends ABNORMAL too, with the dual simplex (same LP,
        so the dual bound stays a certificate)."""
        self.solver.Objective().SetMaximization()
        self.solver.SetTimeLimit(int(time_limit * 1000))
        status = self.solver.Solve()
        if status == pywraplp.Solver.ABNORMAL:
            params = pywraplp.MPSolverParameters()
            params.SetIntegerParam(params.PRESOLVE, params.PRESOLVE_OFF)
            status = self.solver.Solve(params)
        if status == pywraplp.Solver.ABNORMAL:
            # the dual simplex: multigpu50 seed 50 with the dominated-count rows ends
            # ABNORMAL with and without presolve in the primal, optimal in the dual (180 s)
            self.solver.SetSolverSpecificParametersAsString("use_dual_simplex: true")
            status = self.solver.Solve()
            self.solver.SetSolverSpecificParametersAsString("")
        if status == pywraplp.Solver.OPTIMAL:
            return "optimal"
        return "infeasible" if status == pywraplp.Solver.INFEASIBLE else "unknown"

    def value(self) -> float:
        return float(self.solver.Objective().Value())

    def primal(self, j: int) -> float:
        return float(self.vars[j].solution_value())

    def dual_bound(self) -> float:
        y = np.array([c.dual_value() for c in self.rows], dtype=np.float64)
        total = 0.0
        for i, yi in enumerate(y):
            side = self.hi[i] if yi > 0 else self.lo[i]
            if yi == 0 or not math.isfinite(side) or abs(side) >= self.inf:
                y[i] = 0.0  # this row's dual would make the bound infinite: drop it
                continue
            total += yi * side
        for j, v in enumerate(self.vars):
            rc = self.obj[j] - sum(a * y[i] for i, a in self.cols[j])
            total += max(rc * v.lb(), rc * v.ub())
        return total


# --- the model --------------------------------------------------------------------------


@dataclass
class SlicedModel:
    """The relaxation of the module docstring, built once; ``b`` maps (slice, class) to
    the blocking variable so that branch and bound can fix it."""

    inst: Instance
    lp: CertifiedLP
    b: dict[tuple[int, int], int]
    major: list[int]
    n_slices: int
    # per major class: its arrivals, its end placement's variables, and the weight of one
    # pod (its GPU milli, or for a CPU-only class its cpu at the cluster's milli per cpu)
    arrivals: dict[int, int] = field(default_factory=dict)
    weight: dict[int, float] = field(default_factory=dict)
    # every class's placement per type at the cut, X_end,t,q (also :mod:`sim.openb.floors`)
    x_last: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def x_end(self) -> dict[int, list[int]]:
        """Per major class, its placement variables at the cut (one per type)."""
        return {q: [j for (_, q2), j in self.x_last.items() if q2 == q] for q in self.major}


def slice_ends(n_arrivals: int, slices: Sequence[float]) -> list[int]:
    """g_0 < ... < g_K-1: the arrival counts at which the slices are read (the last is
    the cut)."""
    n = n_arrivals
    return sorted({max(1, min(n, round(f * n))) for f in slices} | {n})


def build(inst: Instance, slices: Sequence[float] = SLICES, major: float = MAJOR) -> SlicedModel:
    lp = CertifiedLP()
    inf = lp.inf
    T, Q = inst.n_types, inst.n_classes
    n = inst.n_arrivals
    gs = slice_ends(n, slices)
    K, last = len(gs), len(gs) - 1
    A = np.stack([inst.arrived(g) for g in gs])  # [K, Q]
    total = inst.total()
    d = inst.demand.astype(float)
    cpu, mem = inst.cls_cpu.astype(float), inst.cls_mem.astype(float)
    gpus = inst.cls_gpus.astype(float)
    pairs = [(t, q) for t in range(T) for q in range(Q) if inst.ok[q, t] and total[q] > 0]
    X = {(k, t, q): lp.var(0.0, float(A[k, q]), float(d[q]) if k == last else 0.0)
         for k in range(K) for t, q in pairs}
    by_type: dict[int, list[int]] = {}
    by_class: dict[int, list[int]] = {}
    for t, q in pairs:
        by_type.setdefault(t, []).append(q)
        by_class.setdefault(q, []).append(t)
    for k in range(K):
        for q, ts in by_class.items():
            lp.row(-inf, float(A[k, q]), [(X[k, t, q], 1.0) for t in ts])
            if k < last:
                for t in ts:
                    lp.row(-inf, 0.0, [(X[k, t, q], 1.0), (X[k + 1, t, q], -1.0)])
    gpu_total = float((inst.type_count * inst.type_gpus).sum())
    # per slice and type, what the pods placed so far use (one row each, so that the
    # rows below read a handful of variables instead of every class)
    use: dict[tuple[str, int, int], int] = {}
    for t, qs in by_type.items():
        nn, g = float(inst.type_count[t]), int(inst.type_gpus[t])
        caps = {"cpu": nn * float(inst.type_cpu[t]), "mem": nn * float(inst.type_mem[t]),
                "milli": nn * g * GPU_MILLI, "whole": nn * g,
                "touch": float(sum(inst.cls_gpus[q] * total[q] for q in qs))}
        coef = {"cpu": cpu, "mem": mem, "milli": d, "whole": np.where(inst.whole, gpus, 0.0),
                "touch": gpus}
        for k in range(K):
            for key, c in coef.items():
                # at the end the type's capacity; before it, never more than at the end
                use[key, k, t] = u = lp.var(0.0, max(caps[key], 0.0))
                lp.row(0.0, 0.0, [(u, -1.0)] + [(X[k, t, q], float(c[q])) for q in qs if c[q]])
    H: dict[int, int] = {}
    U: dict[tuple[int, int], int] = {}
    for t, qs in by_type.items():
        nn, g = float(inst.type_count[t]), int(inst.type_gpus[t])
        end = [(X[last, t, q], q) for q in qs]
        H[t] = lp.var(0.0, nn * g)
        lp.row(-inf, nn * g, [(H[t], 1.0), (use["whole", last, t], 1.0)])
        lp.row(-inf, 0.0, [(H[t], -1.0)] + [(v, d[q] / GPU_MILLI) for v, q in end
                                            if inst.shared[q]])
        for per in range(1, g):
            big = [v for v, q in end if inst.whole[q] and inst.cls_gpus[q] * (per + 1) > g]
            if big:
                lp.row(-inf, per * nn, [(v, 1.0) for v in big])
        for k in range(K):
            U[k, t] = u = lp.var(0.0, nn * g)
            lp.row(-inf, 0.0, [(u, 1.0), (use["touch", k, t], -1.0)])
            lp.row(-inf, 0.0, [(u, -1.0), (use["milli", k, t], 1.0 / GPU_MILLI)])
            if k > 0:
                lp.row(-inf, 0.0, [(U[k - 1, t], 1.0), (u, -1.0)])
            if k < last:  # whole GPUs taken after slice k were untouched at slice k
                lp.row(-inf, nn * g, [(u, 1.0), (use["whole", last, t], 1.0),
                                      (use["whole", k, t], -1.0)])
    _share_flow(inst, lp, by_type, X, last, H, gpu_total)
    tracked = [q for q in range(Q) if total[q] > 0]
    weight = np.maximum(total * d / max(float((total * d).sum()), 1.0),
                        total * cpu / max(float((total * cpu).sum()), 1.0))
    majors = [q for q in tracked if weight[q] >= major]
    B: dict[tuple[int, int], int] = {}
    mixes = {t: _least_mix(inst, t) for t in by_type}  # per type, for every blocking row
    for q in tracked:
        ts = by_class.get(q, [])
        for k in range(K):
            B[k, q] = b = lp.var(0.0, 1.0)
            if k > 0:
                lp.row(-inf, 0.0, [(B[k - 1, q], 1.0), (b, -1.0)])
            if q in majors:
                for t in ts:
                    _blocking(inst, lp, q, k, t, b, X, U, use, by_type[t], last, mixes[t])
        # must-place (the per-slice rows of the module docstring follow from these)
        _first_blocking(lp, [[X[k, t, q] for t in ts] for k in range(K)],
                        [B[k, q] for k in range(K)], [float(a) for a in A[:, q]])
    dom = {q: {q2 for q2 in tracked if q2 != q and dominates(inst, q, q2)} for q in tracked}
    for q in tracked:
        for q2 in dom[q]:
            if q in dom[q2] and q2 < q:
                continue  # equal classes: one direction is enough
            if any(q2 in dom[q3] and q not in dom[q3] for q3 in dom[q] if q3 != q2):
                continue  # implied through q3 (the transitive reduction suffices)
            for k in range(K):
                lp.row(-inf, 0.0, [(B[k, q], 1.0), (B[k, q2], -1.0)])
    # counts of dominated classes (:func:`_dominated_counts`): each class against all the
    # GPU classes it dominates weighted by their demand, and against those of each kind
    # (shares, one whole GPU, several) apart; a major class also against each major
    # class it dominates, unweighted
    for q in tracked:
        heavy = {q2: float(d[q2]) for q2 in sorted(dom[q]) if d[q2] > 0}
        groups = [{q2: 1.0} for q2 in sorted(dom[q]) if q in majors and q2 in majors]
        if heavy and not (len(heavy) == 1 and q in majors and set(heavy) <= set(majors)):
            groups.append(heavy)  # (a single major class: its pairwise row is there)
        for kind in (inst.shared, inst.whole & (inst.cls_gpus == 1),
                     inst.whole & (inst.cls_gpus > 1)):
            part = {q2: w for q2, w in heavy.items() if kind[q2]}
            if 1 < len(part) < len(heavy):
                groups.append(part)
        for group in groups:
            # weights scaled to at most 1 (the row is the same; GLOP ended ABNORMAL on
            # default seed 51 with the demand in milli as weights)
            top = max(group.values())
            group = {q2: w / top for q2, w in group.items()}
            rows = _dominated_counts(inst.positions[q], [(inst.positions[q2], w)
                                                         for q2, w in group.items()])
            # by the cut only: the same rows hold at every slice too, but with them
            # multigpu40's coarse root (seed 42) had not ended after 8 minutes, against
            # 18 s without them (what they would gain was not measured)
            for slope, cut in rows:
                lp.row(-inf, cut, [(X[last, t, q], -slope) for t in by_class.get(q, [])]
                       + [(X[last, t, q2], w) for q2, w in group.items()
                          for t in by_class.get(q2, [])])
    per_cpu = float(inst.capacity_milli) / max(float((inst.type_count * inst.type_cpu).sum()), 1.0)
    return SlicedModel(inst=inst, lp=lp, b=B, major=majors, n_slices=K,
                       arrivals={q: int(total[q]) for q in majors},
                       weight={q: float(d[q]) if d[q] > 0 else float(cpu[q]) * per_cpu
                               for q in majors},
                       x_last={(t, q): X[last, t, q] for t, q in pairs})


def _dominated_counts(positions: IntArray, others: Sequence[tuple[IntArray, float]]
                      ) -> list[tuple[float, float]]:
    """Rows y <= slope x + cut over the pods x of a class q placed by the cut and the
    weighted pods y = sum_i w_i y_i placed of classes q_i that q dominates (every node
    that rejects q rejects q_i: :func:`dominates`). Why they hold for every run: the
    placed pods of a class are a prefix of its arrivals (once one fails, the class is
    blocked for good), so x = n < N_q means q's (n+1)-th pod, at position p_n+1, found
    every node rejecting it; then every node rejects each q_i from p_n+1 on, and y_i is
    at most G_i(n), the q_i arriving before p_n+1 (G_i(N_q): all of them). So (x, y) lies
    under the step function G = sum_i w_i G_i at the integers, and under its least
    concave majorant, whose edges are the rows (an upper hull: a handful of edges for
    arrivals in random order). Issue 38, multigpu40 seed 42, the node that decided the
    bound: the LP placed 71% of the 810-milli class and 76% of a whole-GPU class it
    dominates, where every run places whole GPUs only up to the 810s' first failure."""
    n_q = len(positions)
    g = np.zeros(n_q + 1, dtype=np.float64)
    for pos, w in others:
        counts = np.searchsorted(pos, positions).astype(np.float64)  # before p_1 .. p_N
        g[:n_q] += w * counts
        g[n_q] += w * len(pos)
    hull: list[int] = []  # the upper hull's vertices, left to right (monotone chain)
    for n in range(n_q + 1):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # drop b when it lies on or under the chord from a to n
            if (g[b] - g[a]) * (n - a) <= (g[n] - g[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(n)
    rows = []
    for a, b in itertools.pairwise(hull):
        slope = (g[b] - g[a]) / (b - a)
        rows.append((float(slope), float(g[a] - slope * a)))
    return rows


def _first_blocking(lp: CertifiedLP, x: list[list[int]], b: list[int], a: list[float]) -> None:
    """Must-place by the slice where the class first blocks: with f_j = b_j - b_j-1 (b_-1
    = 0) the share of runs that first block at slice j, the pods placed by slice k are at
    least sum_{1<=j<=k} f_j A_j-1 + (1 - b_k) A_k (not blocked at j-1: all of its arrivals
    so far placed) and at most f_0 A_0 + sum_{1<=j<=k} f_j A_j + (1 - b_k) A_k (blocked at j:
    none after it). For 0/1 b both are the must-place rows themselves; for fractional b
    they weigh each first-blocking slice by its share where the per-slice rows take only
    the tightest slice (issue 38, multigpu40 seed 42: a 470-milli class with b = 0.43 at
    60% of the arrivals and 0.71 at the cut had 35% of its pods placed, these rows ask at
    least 49%). They imply the per-slice rows (f_j >= 0, A nondecreasing), which are
    therefore not added: at slice 0 the lower row is A_0 (1 - b_0) itself."""
    inf = lp.inf
    for k in range(len(b)):
        xs = [(j, 1.0) for j in x[k]]
        low = [(b[j], -(a[j - 1] if j >= 1 else 0.0) + (a[j] if j < k else a[k]))
               for j in range(k + 1)]
        lp.row(a[k], inf, xs + low)
        if k:  # at slice 0 the upper row is X_0 <= A_0, the variables' own bound
            lp.row(-inf, a[k], xs + [(b[j], -(a[j] - a[j + 1])) for j in range(k)])


def _share_flow(inst: Instance, lp: CertifiedLP, by_type: dict[int, list[int]],
                X: dict[tuple[int, int, int], int], last: int, H: dict[int, int],
                gpu_total: float) -> None:
    """The shares of all types packed GPU by GPU: an arc flow (Valerio de Carvalho) over
    the reachable sums 0..1000 milli; a unit of flow is one GPU holding shares, an arc of
    size m one share of m milli on it. Its LP equals the Gilmore-Gomory bound."""
    sizes = sorted({int(m) for m in inst.cls_milli[inst.shared]})
    if not sizes:
        return
    cap = GPU_MILLI // UNIT
    steps = [m // UNIT for m in sizes]
    reach = [False] * (cap + 1)
    reach[0] = True
    for u in range(cap + 1):
        if reach[u]:
            for s in steps:
                if u + s <= cap:
                    reach[u + s] = True
    n_shares = float(inst.total()[inst.shared].sum())
    F = lp.var(0.0, gpu_total)
    into: dict[int, list[tuple[int, float]]] = {u: [] for u in range(cap + 1) if reach[u]}
    out: dict[int, list[tuple[int, float]]] = {u: [] for u in into}
    by_size: dict[int, list[tuple[int, float]]] = {m: [] for m in sizes}
    for u in into:
        for m, s in zip(sizes, steps, strict=True):
            if u + s <= cap:
                a = lp.var(0.0, n_shares)
                out[u].append((a, -1.0))
                into[u + s].append((a, 1.0))
                by_size[m].append((a, 1.0))
        out[u].append((lp.var(0.0, gpu_total), -1.0))  # the GPU's packing ends here
    into[0].append((F, 1.0))
    for u in into:
        lp.row(0.0, 0.0, into[u] + out[u])
    for m in sizes:
        terms = list(by_size[m])
        for t, qs in by_type.items():
            terms += [(X[last, t, q], -1.0) for q in qs
                      if inst.shared[q] and inst.cls_milli[q] == m]
        lp.row(0.0, lp.inf, terms)
    lp.row(0.0, lp.inf, [(h, 1.0) for h in H.values()] + [(F, -1.0)])


@dataclass(frozen=True)
class LeastMix:
    """The least of one resource that the pods on a node of one type carry per unit of
    another: every pod there is of a class allowed on the type, so a node's usage
    (cpu_n, mem_n, milli_n) has cpu_n >= cpu_per_mem x mem_n, mem_n >= mem_per_cpu x
    cpu_n, cpu_n >= cpu_per_milli x milli_n and mem_n >= mem_per_milli x milli_n (the
    minima of the ratios over those classes, rounded down (:func:`_round_down`); 0 where
    a class asks none of the first)."""

    cpu_per_mem: float
    mem_per_cpu: float
    cpu_per_milli: float
    mem_per_milli: float
    milli_per_gpu: float  # the least milli a GPU pod holds on each GPU it touches


def _round_down(x: float, bits: int = 6) -> float:
    """``x`` rounded down to 1 + ``bits`` significant bits, so within a factor 1 - 2^-bits
    of it (0 and below give 0). A smaller ratio keeps the rows valid; ratios such as 2.048
    MiB per milli-cpu, with their full binary expansion, left GLOP's first solve ABNORMAL
    on 10% of small random instances and without an answer after the fallbacks
    (:meth:`CertifiedLP.solve`) on 2% (tests/test_sim_floors.py found one), against 4%
    and none rounded so, and 3% and none without the cross terms (seeds 150-199 of that
    test's cases, both slice sets)."""
    if x <= 0.0:
        return 0.0
    step = 2.0 ** (math.floor(math.log2(x)) - bits)
    return math.floor(x / step) * step


def _least_mix(inst: Instance, t: int) -> LeastMix:
    ok = inst.ok[:, t]
    cpu = inst.cls_cpu[ok].astype(np.float64)
    mem = inst.cls_mem[ok].astype(np.float64)
    gpus = inst.cls_gpus[ok].astype(np.float64)
    milli = inst.cls_milli[ok].astype(np.float64) * gpus

    def least(num: FloatArray, den: FloatArray) -> float:
        per = num[den > 0] / den[den > 0]
        return _round_down(float(per.min())) if per.size else 0.0

    return LeastMix(cpu_per_mem=least(cpu, mem), mem_per_cpu=least(mem, cpu),
                    cpu_per_milli=least(cpu, milli), mem_per_milli=least(mem, milli),
                    milli_per_gpu=least(milli, gpus))


def _blocking(inst: Instance, lp: CertifiedLP, q: int, k: int, t: int, b: int,
              X: dict[tuple[int, int, int], int], U: dict[tuple[int, int], int],
              use: dict[tuple[str, int, int], int], qs: list[int], last: int,
              mix: LeastMix) -> None:
    """Class q blocked at slice k, on the nodes of type t (module docstring); ``mix``:
    the type's :func:`_least_mix`."""
    inf = lp.inf
    nn, g = float(inst.type_count[t]), int(inst.type_gpus[t])
    cap_c, cap_m = float(inst.type_cpu[t]), float(inst.type_mem[t])
    c_q, r_q = float(inst.cls_cpu[q]), float(inst.cls_mem[q])
    zc, zm, zg = lp.var(0.0, nn), lp.var(0.0, nn), lp.var(0.0, nn)
    lp.row(0.0, 0.0, [(zc, 1.0), (zm, 1.0), (zg, 1.0), (b, -nn)])
    short_c, short_m = cap_c - c_q + 1, cap_m - r_q + 1
    g_milli = 0.0  # the GPU milli a node short of GPUs for q holds at least
    if inst.cls_gpus[q] > 0 and inst.shared[q]:
        g_milli = float(g * (GPU_MILLI - inst.cls_milli[q] + 1))
    elif inst.cls_gpus[q] > 0:
        g_milli = float((g - inst.cls_gpus[q] + 1) * mix.milli_per_gpu)
    lp.row(0.0, inf, [(zc, -short_c), (zm, -mix.cpu_per_mem * short_m),
                      (zg, -mix.cpu_per_milli * g_milli), (use["cpu", k, t], 1.0)])
    lp.row(0.0, inf, [(zm, -short_m), (zc, -mix.mem_per_cpu * short_c),
                      (zg, -mix.mem_per_milli * g_milli), (use["mem", k, t], 1.0)])
    if inst.cls_gpus[q] == 0:
        lp.set_bounds(zg, 0.0, 0.0)  # only cpu or memory block a CPU-only pod
        w_g = float(g)
    elif inst.shared[q]:
        lp.row(0.0, inf, [(U[k, t], 1.0), (zg, -float(g))])
        lp.row(0.0, inf, [(zg, -float(g * (GPU_MILLI - inst.cls_milli[q] + 1))),
                          (use["milli", k, t], 1.0)])
        w_g = 0.0
    else:
        lp.row(0.0, inf, [(U[k, t], 1.0), (zg, -float(g - inst.cls_gpus[q] + 1))])
        w_g = float(inst.cls_gpus[q] - 1)
    if k == last:
        return  # blocked at the end: nothing is placed after it
    big = nn * cap_c  # cpu placed after slice k fits in what the states leave
    lp.row(-inf, big, [(zc, -(c_q - 1)), (zm, -cap_c), (zg, -cap_c), (b, big),
                       (use["cpu", last, t], 1.0), (use["cpu", k, t], -1.0)])
    big = nn * cap_m
    lp.row(-inf, big, [(zm, -(r_q - 1)), (zc, -cap_m), (zg, -cap_m), (b, big),
                       (use["mem", last, t], 1.0), (use["mem", k, t], -1.0)])
    whole = [q2 for q2 in qs if inst.whole[q2]]
    if not whole:
        return
    big = nn * g
    wc, wm, wg = lp.var(0.0, big), lp.var(0.0, big), lp.var(0.0, big)
    lp.row(0.0, 0.0, [(wc, 1.0), (wm, 1.0), (wg, 1.0), (use["whole", last, t], -1.0),
                      (use["whole", k, t], 1.0)])
    for w, z, per, admits in (
        (wc, zc, float(g), [q2 for q2 in whole if inst.cls_cpu[q2] < c_q]),
        (wm, zm, float(g), [q2 for q2 in whole if inst.cls_mem[q2] < r_q]),
        (wg, zg, w_g, [q2 for q2 in whole if inst.cls_gpus[q2] <= w_g]),
    ):
        lp.row(-inf, big, [(w, 1.0), (z, -per), (b, big)])
        if len(admits) < len(whole):  # only these classes may land on such nodes
            gpus = inst.cls_gpus
            lp.row(-inf, big, [(w, 1.0), (b, big)]
                   + [(X[last, t, q2], -float(gpus[q2])) for q2 in admits]
                   + [(X[k, t, q2], float(gpus[q2])) for q2 in admits])


# --- the bound, and branch and bound on the major classes' blocking slices -------------


@dataclass(frozen=True)
class Bound:
    """The bound of one trace and seed: ``alloc_130``, % of GPU capacity."""

    alloc_130: float
    kind: str  # "certificate": a proven upper bound
    lp_130: float  # the LP solver's own optimum, % (the certificate is within tolerance)
    demand_pct: float  # arrived GPU demand up to the cut, %
    nodes: int = 1  # LPs solved (branch and bound)
    seconds: float = 0.0
    log: tuple[str, ...] = field(default_factory=tuple)
    # where branch and bound stopped: passed back as ``resume`` it goes on with a larger
    # budget (:func:`allocation_bound`)
    frontier: Frontier | None = None

    def to_json(self) -> dict[str, object]:
        return {"alloc_130": round(self.alloc_130, 2), "kind": self.kind}


@dataclass(frozen=True)
class Frontier:
    """Branch and bound's state between LPs: the open nodes (certificate, per fixed class
    its first-blocking interval, per major class the LP's b and unplaced weight, as
    :func:`_solve` gives them), the best integral leaf, the stalled classes, the LPs
    solved, the root's LP value (milli) and the log so far. Plain data, so a bench can
    keep it in JSON (:meth:`to_json`, :meth:`from_json`) and deepen a run later; it is
    valid only for the instance, slices, ``major`` and split rule it came from."""

    open_nodes: tuple[tuple[float, tuple[tuple[int, int, int], ...],
                            tuple[tuple[int, tuple[float, ...]], ...]], ...]
    best_leaf: float
    stalled: tuple[int, ...]
    solved: int
    root_lp: float
    log: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {"open": [[b, [list(f) for f in fixed], [[q, list(v)] for q, v in bvals]]
                         for b, fixed, bvals in self.open_nodes],
                "best_leaf": None if self.best_leaf == -math.inf else self.best_leaf,
                "stalled": list(self.stalled), "solved": self.solved,
                "root_lp": self.root_lp, "log": list(self.log)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Frontier:
        leaf = doc["best_leaf"]
        return cls(tuple((float(b), tuple((int(q), int(lo), int(hi)) for q, lo, hi in fixed),
                          tuple((int(q), tuple(float(x) for x in v)) for q, v in bvals))
                         for b, fixed, bvals in doc["open"]),
                   -math.inf if leaf is None else float(leaf),
                   tuple(int(q) for q in doc["stalled"]), int(doc["solved"]),
                   float(doc["root_lp"]), tuple(str(line) for line in doc["log"]))


def _fix(model: SlicedModel, first: dict[int, tuple[int, int]]) -> None:
    """Restrict the slice where each major class in ``first`` is first blocked to
    [lo, hi] (hi = K: not even at the end): b_k = 0 below lo, 1 from hi on."""
    for q in model.major:
        lo, hi = first.get(q, (0, model.n_slices))
        for k in range(model.n_slices):
            model.lp.set_bounds(model.b[k, q], float(k >= hi), float(k >= lo))


def _solve(model: SlicedModel, parent: float = math.inf
           ) -> tuple[float, float, dict[int, list[float]]] | None:
    """(certified bound, LP value, per major class its b per slice followed by what the LP
    leaves of it unplaced, weighted: :attr:`SlicedModel.weight`); None when proven
    infeasible; the parent's bound when the solver gives no answer (so the result stays
    valid)."""
    status = model.lp.solve()
    if status == "infeasible":
        return None
    if status != "optimal":
        return parent, parent, {q: [0.5] * model.n_slices + [1.0] for q in model.major}
    x_end = model.x_end
    bvals = {q: [model.lp.primal(model.b[k, q]) for k in range(model.n_slices)]
             + [model.weight[q] * max(0.0, float(model.arrivals[q])
                                      - sum(model.lp.primal(j) for j in x_end[q]))]
             for q in model.major}
    return model.lp.dual_bound(), model.lp.value(), bvals


SPLITS = ("fractional", "middle")


def _split_slice(rule: str, b: list[float], lo: int, hi: int) -> int | None:
    """The slice m at which a node splits its class's first-blocking interval [lo, hi]
    into [lo, m] and [m + 1, hi] (None: b is integral there). ``b`` is the class's b per
    slice in the node's LP; it is nondecreasing, so its fractional slices form one run
    [a, c] inside [lo, hi - 1] (b is fixed outside). "fractional": the most fractional
    slice; "middle": the run's middle slice (a + c) // 2, which halves the interval the
    LP leaves open instead of peeling one slice off it. Both cut the node's LP point off
    in both children (b_m is fractional: 1 in the first, 0 in the second)."""
    run = [k for k in range(lo, min(hi, len(b))) if 1e-6 < b[k] < 1.0 - 1e-6]
    if not run:
        return None
    if rule == "middle":
        return (run[0] + run[-1]) // 2
    return max(run, key=lambda k: (min(b[k], 1.0 - b[k]), k))


def allocation_bound(inst: Instance, *, slices: Sequence[float] = SLICES,
                     major: float = MAJOR, budget: int = 1, split: str = "fractional",
                     resume: Frontier | None = None,
                     on_branch: Callable[[Bound], None] | None = None) -> Bound:
    """The certificate: the relaxation's dual bound, tightened by at most ``budget`` LPs
    of branch and bound on the major classes' blocking slices (best first; the result is
    the largest bound among the leaves and the branches left open). ``split``: where a
    node splits the interval of its class's first blocking slice (:func:`_split_slice`).
    ``resume``: the :attr:`Bound.frontier` of an earlier call with the same instance,
    slices, ``major`` and ``split``; the search goes on from there (its LPs count toward
    ``budget``) as a single call with ``budget`` would, except that its LPs start from a
    fresh solver, not from the previous LP's state (pywraplp's GLOP keeps it and has no
    reset): the figures agree to rounding, and where an LP has several optimal points
    the branching may differ (the result is a certificate either way). ``on_branch``
    receives the result so far after each branch (a bench keeps it, so that a run
    stopped midway is resumed from its last branch)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    t0 = time.perf_counter()
    model = build(inst, slices, major)
    cap = float(inst.capacity_milli)
    demand = float((inst.demand * inst.total()).sum())
    ceiling = min(demand, cap)
    Fixing = dict[int, tuple[int, int]]
    open_nodes: list[tuple[float, Fixing, dict[int, list[float]]]]
    if resume is None:
        root = _solve(model)
        if root is None or not math.isfinite(root[0]):
            # infeasible would be a bug (every run is a point of it); no answer is GLOP's
            # time limit or numerical trouble (gpuspec33 with fine slices, two LP runs
            # sharing 2 cores: over 600 s)
            raise RuntimeError("the bound's root LP ended without an optimum (infeasible: a"
                               " bug; else GLOP's time limit of CertifiedLP.solve or numerical"
                               " trouble): nothing is certified")
        log = [f"root: lp {100 * root[1] / cap:.3f} certified {100 * root[0] / cap:.3f}"]
        open_nodes = [(root[0], {}, root[2])]
        best_leaf = -math.inf
        solved = 1
        root_lp = root[1]
        # classes whose branch moved neither child's figure (pseudo-costs of zero): branched
        # on again only when no other class is fractional, so the budget goes where it moved
        stalled: set[int] = set()
    else:
        open_nodes = [(b, {q: (lo, hi) for q, lo, hi in fixed}, {q: list(v) for q, v in bvals})
                      for b, fixed, bvals in resume.open_nodes]
        best_leaf, solved, root_lp = resume.best_leaf, resume.solved, resume.root_lp
        stalled = set(resume.stalled)
        log = list(resume.log[:-1])  # without its closing line

    def result() -> Bound:
        """The certificate so far, and the frontier to go on from."""
        top = max([best_leaf] + [node[0] for node in open_nodes])
        done = (*log, f"branch and bound: {solved} LPs, bound {100 * top / cap:.3f}")
        frontier = Frontier(
            tuple((b, tuple((q, lo, hi) for q, (lo, hi) in sorted(fixed.items())),
                   tuple((q, tuple(v)) for q, v in sorted(bvals.items())))
                  for b, fixed, bvals in open_nodes),
            best_leaf, tuple(sorted(stalled)), solved, root_lp, done)
        return Bound(100.0 * min(top, ceiling) / cap, "certificate",
                     100.0 * min(root_lp, ceiling) / cap, 100.0 * demand / cap, solved,
                     time.perf_counter() - t0, done, frontier)

    while open_nodes and solved < budget:
        open_nodes.sort(key=lambda node: -node[0])
        bound, fixed, bvals = open_nodes.pop(0)
        if bound <= best_leaf:
            continue
        # branch on the most fractional blocking variable of a major class: blocked
        # from slice k on, or not yet at slice k
        # (of the class whose pods the LP leaves unplaced most, weighted by their GPU
        # milli: the root's excess comes from heavy share classes it need not place)
        frac = [(q not in stalled, bvals[q][-1], min(v, 1.0 - v), q, k) for q in model.major
                for k, v in enumerate(bvals[q][:-1]) if 1e-6 < v < 1.0 - 1e-6]
        if not frac:
            best_leaf = max(best_leaf, bound)  # integral: this LP is the leaf's value
            continue
        *_, q, k = max(frac)
        lo, hi = fixed.get(q, (0, model.n_slices))
        m = _split_slice(split, bvals[q][:-1], lo, hi)  # "fractional": k itself
        k = k if m is None else m
        got = []
        moved = False
        for child in ({**fixed, q: (lo, k)}, {**fixed, q: (k + 1, hi)}):
            if child[q][0] > child[q][1]:
                continue
            _fix(model, child)
            found = _solve(model, bound)
            solved += 1
            got.append("infeasible" if found is None else f"{100 * min(found[0], bound) / cap:.3f}")
            moved = moved or found is None or found[0] < bound - STALL * cap
            if found is not None:
                # the child's LP is the parent's with b fixed further, so the parent's
                # certificate also bounds the child's runs: keep the smaller of the two
                open_nodes.append((min(found[0], bound), child, found[2]))
        if not moved:
            stalled.add(q)
        top = max([best_leaf] + [node[0] for node in open_nodes])
        log.append(f"  {solved} LPs: {100 * top / cap:.3f} (class {q} blocked by slice {k}"
                   f" / not: {' / '.join(got)})")
        if on_branch is not None:
            on_branch(result())
    _fix(model, {})
    return result()
