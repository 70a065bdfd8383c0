"""The planner's solver in a process of its own, so a solve never holds the GIL of the
process that answers kube-scheduler.

:class:`SolverProcess` starts one child with the ``spawn`` context (a fresh interpreter:
nothing of the request process's threads or locks is inherited) and keeps it for every
solve. A job is the snapshot, sent as pickled pieces; the answer is the placements.

Sending a 5,000-node snapshot as one ``pickle.dumps`` holds the GIL for ~70 ms, a
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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from packing.cpsat import SolverParams
from packing.model import NodeInfo, Placement, PlanResult, PodRequest, Snapshot
from packing.policies import get_policy
from packing.policies.base import Policy
from packing.policies.fgd import Shape, cluster_fragmentation
from packing.policies.gpupack import GpupackPolicy
from packing.state import ClusterState
from scheduler.child import ChildGone, ChildProcess, ChildTimeout, background, serve_messages

log = logging.getLogger("gpupack.scheduler.solve")

CHUNK = 128  # items per pickle call: ~1-2 ms of GIL at most


def make_policy(name: str, params: SolverParams) -> Policy:
    if name == "gpupack":
        return GpupackPolicy(params)
    return get_policy(name)


@dataclass(frozen=True)
class SolveJob:
    """What one solve needs; picklable (frozen dataclasses and tuples only)."""

    policy: str
    params: SolverParams
    snapshot: Snapshot  # the whole cluster (fragmentation is measured on it)
    batch: tuple[PodRequest, ...]  # the pending pods to plan this time
    shapes: tuple[tuple[Shape, float], ...]  # the typical shapes, for the fragmentation
    per_class: int = 0  # candidate nodes per node-state class (see candidates); 0: all


@dataclass(frozen=True)
class SolveOutcome:
    placements: tuple[Placement, ...]
    unschedulable: tuple[tuple[str, str], ...]  # (pod key, reason)
    status: str
    seconds: float
    fragmentation: float


def solve(job: SolveJob) -> SolveOutcome:
    """Plan ``job.batch`` on ``job.snapshot`` with the named policy (any process)."""
    snap = job.snapshot
    return _solve(job, snap.nodes, lambda: iter(snap.running))


def solve_packed(packed: tuple[Any, ...]) -> SolveOutcome:
    """:func:`solve` of a job as :class:`SnapshotPacker` sent it, reading the running pods
    chunk by chunk as they are counted: the 50,000 running pods of a 5,000-node cluster
    are never all unpickled at once (~25 MiB less at the solver child's peak); only the
    candidate nodes' pods are read a second time. Same answer as ``solve(unpack(...))``."""
    policy, params, nodes, running, pending, rest = packed
    batch, shapes, per_class = pickle.loads(rest)
    infos = tuple(pickle.loads(b) for b in nodes)
    job = SolveJob(policy, params, Snapshot(infos, (), unpickle_chunks(pending)), batch,
                   shapes, per_class)
    return _solve(job, infos, lambda: (x for b in running for x in pickle.loads(b)))


def _solve(job: SolveJob, nodes_all: tuple[NodeInfo, ...],
           running: Callable[[], Iterator[tuple[PodRequest, Placement]]]) -> SolveOutcome:
    """The solve over the snapshot's nodes and the pods ``running()`` yields (called once
    for the whole cluster, again for the pods of the nodes planned over)."""
    started = time.monotonic()
    full = ClusterState(Snapshot(nodes_all))
    # As ClusterState counts a snapshot's running pods (the owners recorded in MIG
    # layouts are superseded by placements).
    for pod, placement in running():
        full.apply(pod, placement, allow_overcommit=True)
    unplaceable: set[str] = set()
    keep: set[str] | None = None
    if job.batch and job.per_class and not any(p.group for p in job.batch):
        keep, unplaceable = candidates(full, job.batch, job.per_class)
    # The fragmentation figure is taken before the plan (which never changes ``full``),
    # so the whole cluster's state is gone while the plan builds its own; its time is
    # not the solve's.
    frag_started = time.monotonic()
    frag = cluster_fragmentation(full, job.shapes) if job.shapes else 0.0
    frag_s = time.monotonic() - frag_started
    del full
    if job.batch:
        nodes = nodes_all
        if keep is not None:
            nodes = tuple(n for n in nodes_all if n.name in keep)
        names = {n.name for n in nodes}
        on_nodes = tuple(r for r in running() if r[1].node in names)
        policy = make_policy(job.policy, job.params)
        result = policy.plan(Snapshot(nodes, on_nodes, job.batch))
        if len(nodes) < len(nodes_all):
            # A pod left out of a plan over candidate nodes may still fit elsewhere: only
            # pods that fit no node at all are reported unschedulable.
            result = PlanResult(result.placements,
                                tuple(u for u in result.unschedulable if u.pod in unplaceable),
                                result.policy, result.solver_status)
    else:
        result = PlanResult((), (), job.policy, solver_status="idle")
    seconds = time.monotonic() - started - frag_s
    return SolveOutcome(
        tuple(result.placements),
        tuple((u.pod, u.reason) for u in result.unschedulable),
        result.solver_status,
        seconds,
        frag,
    )


def candidates(state: ClusterState, batch: Sequence[PodRequest], per_class: int
               ) -> tuple[set[str], set[str]]:
    """Nodes worth planning the batch over, and the batch pods that fit no node now.

    Nodes in the same state (:func:`kube.signatures.node_signature`) are interchangeable
    to the policies; from each class of equal nodes that some batch pod fits, up to
    ``per_class`` nodes (at most one per pod that fits it) are kept, honouring selectors.
    The greedy passes and CP-SAT then work on hundreds of nodes instead of thousands.
    """
    from kube.signatures import node_signature
    from scheduler.verbs import shape_key

    classes: dict[tuple[Any, ...], list[str]] = {}
    for name, n in state.nodes.items():
        classes.setdefault(node_signature(n), []).append(name)
    keep: set[str] = set()
    placeable: set[str] = set()
    by_shape: dict[tuple[Any, ...], list[PodRequest]] = {}
    for pod in batch:
        by_shape.setdefault(shape_key(pod), []).append(pod)
    for pods in by_shape.values():
        pod = pods[0]
        selector = tuple(pod.node_selector.items())
        for members in classes.values():
            allowed = [m for m in members
                       if all(state.nodes[m].info.labels.get(k) == v for k, v in selector)]
            if not allowed or not state.options(pod, allowed[0], dedupe=True):
                continue
            keep.update(allowed[: min(per_class, len(pods))])
            placeable.update(p.key for p in pods)
    return keep, {p.key for p in batch} - placeable


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
            pickle.dumps((job.batch, job.shapes, job.per_class), protocol=pickle.HIGHEST_PROTOCOL),
        )


def pickle_chunks(items: Sequence[Any]) -> tuple[bytes, ...]:
    """``items`` pickled CHUNK at a time (the GIL is free between chunks)."""
    return tuple(pickle.dumps(tuple(items[i:i + CHUNK]), protocol=pickle.HIGHEST_PROTOCOL)
                 for i in range(0, len(items), CHUNK))


def unpickle_chunks(chunks: Sequence[bytes]) -> tuple[Any, ...]:
    return tuple(x for b in chunks for x in pickle.loads(b))


def unpack(packed: tuple[Any, ...]) -> SolveJob:
    policy, params, nodes, running, pending, rest = packed
    batch, shapes, per_class = pickle.loads(rest)
    snapshot = Snapshot(
        tuple(pickle.loads(b) for b in nodes),
        unpickle_chunks(running),
        unpickle_chunks(pending),
    )
    return SolveJob(policy, params, snapshot, batch, shapes, per_class)


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
