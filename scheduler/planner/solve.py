"""The planner's solver in a process of its own, so a solve never holds the GIL of the
process that answers kube-scheduler.

:class:`SolverProcess` starts one child with the ``spawn`` context (a fresh interpreter:
nothing of the request process's threads or locks is inherited) and keeps it for every
solve. A job is what the plan is made over, sent as pickled pieces: normally the
candidate nodes the planner picked (at most a few hundred, see
:func:`scheduler.planner.loop.pick_candidates`) and the pods on them, for a batch with group
members the whole cluster; the answer is the placements. The child never holds more of
the cluster than the job, so its memory does not grow with the cluster's nodes or the
classes of equal nodes (the fragmentation figure is the planner's, in the parent).

A 5,000-node snapshot pickled as one ``pickle.dumps`` holds the GIL for ~70 ms, a
latency spike for any request in flight. :class:`SnapshotPacker` instead pickles each
node once (NodeInfo objects are immutable and the cache keeps the same object while a
node is unchanged, so steady state re-pickles only changed nodes) and the pods in small
chunks; between chunks the request threads get the GIL back.

The child puts itself in the ``SCHED_IDLE`` class (else, where that is refused, it lowers
its ``nice`` value): the solver's workers then run only on CPU time the request path
leaves idle, and are preempted at once when a request thread wakes up. On a busy machine
a solve may do less within its time limit; the greedy answers cover what it misses.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from packing.cpsat import SolverParams
from packing.model import NodeInfo, Placement, PlanResult, PodRequest, Snapshot
from packing.policies.base import Policy
from scheduler.child import (
    ChildGone,
    ChildProcess,
    ChildTimeout,
    background,
    pickle_chunks,
    serve_messages,
    unpickle_chunks,
)
from scheduler.memo.decide import FreeSizes, holding, make_policy

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

log = logging.getLogger("gpupack.scheduler.solve")



@dataclass(frozen=True)
class PlannerParams(SolverParams):
    """The extender planner's CP-SAT settings: ``SolverParams`` with parallel search not
    interleaved. Interleaved search (``SolverParams``' choice for ``workers > 1``, for
    answers reproducible on any machine) keeps every subsolver of the portfolio with its
    own copy of the model at once: at 64 candidate nodes and a 64-pod batch the solver
    peaked ~90 MiB higher with it (~175 MiB over its idle size, ~80 without), ~125 MiB at
    233 nodes. The planner gives up reproducibility anyway (its wall-clock cap is the
    time limit, ``max_wall_s``), and the plans were as good (same objective key on the
    measured jobs but for one node more or less touched).

    Presolve is also kept lean at every model size, as :func:`packing.cpsat.solve_batch`
    does only above ``SYMMETRY_LIMIT`` variables: the planner's models are now that small
    (64 candidate nodes, a 64-pod batch: ~6,700 variables on the soak's cluster), and
    there symmetry detection and probing took the whole budget: "stopped after presolve",
    UNKNOWN after 4.7 s of wall against a 2 s limit, the greedy answer kept. Lean, the
    complete hint is the first solution at once and the search has the rest of the 2 s
    (FEASIBLE in 2.0 s)."""

    def solver(self) -> cp_model.CpSolver:
        solver = super().solver()
        solver.parameters.interleave_search = False
        solver.parameters.symmetry_level = 0
        solver.parameters.cp_model_probing_level = 0
        solver.parameters.max_presolve_iterations = 1
        return solver


def planner_params(params: SolverParams) -> PlannerParams:
    return PlannerParams(**{f.name: getattr(params, f.name) for f in fields(params)})




@dataclass(frozen=True)
class SolveJob:
    """What one solve needs; picklable (frozen dataclasses and tuples only).

    ``snapshot`` holds the nodes to plan over and the pods running on them: the whole
    cluster, or (``unplaceable`` not None) the candidate nodes the planner picked
    (:func:`scheduler.planner.loop.pick_candidates`), so the solver's memory does not grow
    with the cluster. Its pending pods are not read: ``batch`` is what is planned."""

    policy: str
    params: SolverParams
    snapshot: Snapshot
    batch: tuple[PodRequest, ...]  # the pending pods to plan this time
    # The cluster's workload by shape (:func:`compact_workload`), which the policy's
    # scorer is built from (the scorer the verbs use); (): from ``snapshot`` itself.
    workload: tuple[tuple[PodRequest, int, int], ...] = ()
    # Planning over candidate nodes: the batch pods that fit no node of the cluster (the
    # only ones reported unschedulable; a pod left out of such a plan gets the verbs'
    # greedy answer). None: ``snapshot`` is the whole cluster.
    unplaceable: frozenset[str] | None = None
    # (pod key, reason) for the ``unplaceable`` pods, over the whole cluster (the
    # planner's :func:`scheduler.planner.loop.explain_by_class`): the candidate nodes hold
    # none of the nodes that refused them, so the plan's own reason would be "no nodes".
    reasons: tuple[tuple[str, str], ...] = ()
    # The histogram of free sizes the verbs' scorer holds (its sum-of-squares price): the
    # solve's scorer holds the same.
    free_sizes: FreeSizes | None = None
    # The cluster's nodes by capacity class (:func:`compact_nodes`), which the scorer's
    # rare-shape price counts, with ``workload``.
    capacity: tuple[tuple[NodeInfo, int], ...] = ()


@dataclass(frozen=True)
class SolveOutcome:
    placements: tuple[Placement, ...]
    unschedulable: tuple[tuple[str, str], ...]  # (pod key, reason)
    status: str
    seconds: float


def compact_workload(source: Snapshot) -> tuple[tuple[PodRequest, int, int], ...]:
    """A shape workload (:func:`packing.policies.fgd.shape_workload`: one shared pod per
    shape) as (pod, running, pending) counts: a few hundred bytes for any cluster."""
    counts: dict[int, list[Any]] = {}
    for pod, _ in source.running:
        counts.setdefault(id(pod), [pod, 0, 0])[1] += 1
    for pod in source.pending:
        counts.setdefault(id(pod), [pod, 0, 0])[2] += 1
    return tuple((p, r, q) for p, r, q in counts.values())


def compact_nodes(source: Snapshot) -> tuple[tuple[NodeInfo, int], ...]:
    """A shape workload's nodes (stand-ins of their capacity classes,
    :func:`packing.policies.fgd.capacity_classes`) as (stand-in, count)."""
    counts: dict[int, list[Any]] = {}
    for node in source.nodes:
        counts.setdefault(id(node), [node, 0])[1] += 1
    return tuple((n, c) for n, c in counts.values())


def expand_workload(workload: Sequence[tuple[PodRequest, int, int]],
                    capacity: Sequence[tuple[NodeInfo, int]] = ()) -> Snapshot:
    """The snapshot :func:`compact_workload` and :func:`compact_nodes` were taken from,
    as far as a scorer can tell (every pod of a shape, every node of a capacity class,
    is the same object: a list of references, ~8 bytes each)."""
    nowhere = Placement("shape/", "")
    return Snapshot(tuple(n for n, c in capacity for _ in range(c)),
                    tuple((p, nowhere) for p, r, _ in workload for _ in range(r)),
                    tuple(p for p, _, q in workload for _ in range(q)))


def scored_by(policy: Policy, workload: Snapshot, free_sizes: FreeSizes | None = None
              ) -> Policy:
    """``policy`` with its scorer made from ``workload`` whatever snapshot it plans,
    holding ``free_sizes``: a plan over a few candidate nodes then scores options with
    the whole cluster's typical shapes and histogram of free sizes, as the verbs do."""
    make = policy.make_scorer
    policy.__dict__["make_scorer"] = lambda _snapshot: holding(make(workload), free_sizes)
    return policy


def solve(job: SolveJob) -> SolveOutcome:
    """Plan ``job.batch`` on ``job.snapshot`` with the named policy (any process)."""
    snap = job.snapshot
    return _solve(job, snap.nodes, snap.running)


def solve_packed(packed: tuple[Any, ...]) -> SolveOutcome:
    """:func:`solve` of a job as :class:`SnapshotPacker` sent it."""
    return solve(unpack(packed))


def _solve(job: SolveJob, nodes: tuple[NodeInfo, ...],
           running: tuple[tuple[PodRequest, Placement], ...]) -> SolveOutcome:
    started = time.monotonic()
    if job.batch:
        policy = make_policy(job.policy, planner_params(job.params))
        if job.workload:
            policy = scored_by(policy, expand_workload(job.workload, job.capacity),
                               job.free_sizes)
        result = policy.plan(Snapshot(nodes, running, job.batch))
        if job.unplaceable is not None:
            # A pod left out of a plan over candidate nodes may still fit elsewhere: only
            # pods that fit no node at all are reported unschedulable, with the reason
            # the whole cluster gives.
            why = dict(job.reasons)
            result = PlanResult(result.placements,
                                tuple(replace(u, reason=why.get(u.pod, u.reason))
                                      for u in result.unschedulable
                                      if u.pod in job.unplaceable),
                                result.policy, result.solver_status)
    else:
        result = PlanResult((), (), job.policy, solver_status="idle")
    return SolveOutcome(
        tuple(result.placements),
        tuple((u.pod, u.reason) for u in result.unschedulable),
        result.solver_status,
        time.monotonic() - started,
    )


# ---- transport -----------------------------------------------------------------------------


class SnapshotPacker:
    """Pickles a job in small pieces, reusing each unchanged node's bytes."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[NodeInfo, bytes]] = {}

    def pack(self, job: SolveJob) -> tuple[Any, ...]:
        seen: dict[str, tuple[NodeInfo, bytes]] = {}
        pieces: list[bytes] = []
        for info in job.snapshot.nodes:
            old = self._nodes.get(info.name)
            if old is None or old[0] is not info:
                old = (info, pickle.dumps(info, protocol=pickle.HIGHEST_PROTOCOL))
            seen[info.name] = old
            pieces.append(old[1])
        self._nodes = seen
        snap = job.snapshot
        return (
            job.policy, job.params, tuple(pieces),
            pickle_chunks(snap.running), pickle_chunks(snap.pending),
            pickle.dumps((job.batch, job.workload, job.unplaceable, job.reasons, job.free_sizes,
                          job.capacity), protocol=pickle.HIGHEST_PROTOCOL),
        )




def unpack(packed: tuple[Any, ...]) -> SolveJob:
    policy, params, nodes, running, pending, rest = packed
    batch, workload, unplaceable, reasons, free_sizes, capacity = pickle.loads(rest)
    snapshot = Snapshot(
        tuple(pickle.loads(b) for b in nodes),
        unpickle_chunks(running),
        unpickle_chunks(pending),
    )
    return SolveJob(policy, params, snapshot, batch, workload, unplaceable, reasons,
                    free_sizes, capacity)


def solver_main(conn: Connection) -> None:
    """The child's loop: jobs in, ("ok", outcome) or ("error", text) out, until EOF."""
    background()
    serve_messages(conn, solve_packed, trim=True)


class SolverError(RuntimeError):
    """The solve failed in the child, timed out, or the child died."""


class SolverProcess(ChildProcess):
    """One long-lived solver child; :meth:`solve` blocks only the calling thread."""

    def __init__(self, start_method: str = "spawn") -> None:
        super().__init__(solver_main, "gpupack-solver", start_method=start_method,
                         error=SolverError)
        self._packer = SnapshotPacker()

    def started(self) -> None:
        self._packer = SnapshotPacker()  # a fresh child has none of the nodes' bytes

    def solve(self, job: SolveJob, timeout_s: float) -> SolveOutcome:
        self.ensure()
        try:
            value = self.request(self._packer.pack(job), timeout_s)
        except ChildTimeout:
            # A stuck solve is killed; the next one starts a fresh child.
            raise SolverError(f"solver gave no answer in {timeout_s:.0f} s; restarted")\
                from None
        except ChildGone as e:
            raise SolverError(f"solver process died ({e}); it is restarted on the next solve")\
                from None
        if not isinstance(value, SolveOutcome):
            raise SolverError(f"unexpected answer from the solver: {type(value).__name__}")
        return value
