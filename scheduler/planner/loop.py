"""The background planner: a placement plan for every pending pod of our scheduler.

A daemon thread waits for cache changes, lets them settle for ``debounce_s`` (a burst of
watch events becomes one solve), takes a snapshot and has it solved with the configured
policy (``gpupack``: greedy portfolio, then CP-SAT under an explicit time limit, worker
count and seed). The solve runs in a separate solver process (:mod:`scheduler.planner.solve`):
at 1,000-5,000 nodes it is seconds of CPU-bound Python, which in this process would hold
the GIL away from the request threads. The thread picks the nodes to plan over (for a
batch without group members: :func:`scheduler.planner.decide.pick_candidates`, at most
``max_nodes``, the classes
of equal nodes the scorer likes best for each shape of the batch first), packs them with
their pods and waits for the answer; it also takes the cluster's fragmentation figure,
one evaluation per node state, where every node's signature is already known. The verbs
read the latest published :class:`Plan` without waiting; a pod the plan does not know
yet gets the greedy answer from the scorer.

The planner also publishes the policy's scorer for the verbs. The FGD-based scorers
depend on the workload's typical shapes and their frequencies, which move a little with
every pod; the scorer is replaced only when the shapes change or a frequency moves by
more than ``scheduler.planner.decide.SHAPE_TOLERANCE``, because each replacement
invalidates every memoized per-node score (a latency spike on the next requests) for no
real change in preference. gpupack's scorer also holds the cluster's histogram of GPU
free sizes (its sum-of-squares price, :mod:`packing.policies.squares`); the planner
reads it at each cycle from the node states' memoized figures and replaces the scorer
only once it has drifted by more than ``SQUARES_DRIFT`` of the GPUs, for the same
reason (on the openb replay: about ten replacements in a whole fill of 6,212 GPUs).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kube.cache import ClusterCache
from packing.cpsat import SolverParams
from packing.fragmentation import IntArray
from packing.model import NodeInfo, Placement, PodRequest, Snapshot
from packing.policies.fgd import (
    Shape,
    node_fragmentation,
    shape_census,
    shape_workload,
    typical_of,
    workload_of,
)
from packing.policies.gpupack import (
    GpupackScorer,
    free_sizes,
    rare_shapes_key,
    share_gpu_free,
)
from packing.policies.lookahead import keeps_whole_nodes
from packing.policies.squares import BUCKETS
from packing.scoring import Score, order_pods
from packing.state import ClusterState
from scheduler.engine import Loop, LoopMetrics, Outcome
from scheduler.memo.decide import ScorerRef, best_key, holding, make_policy, shape_key
from scheduler.planner.decide import (
    PLAN_NODES,
    backoff_s,
    bare_shapes,
    close_shapes,
    explain_by_class,
    node_capacity,
    pick_candidates,
)
from scheduler.planner.solve import (
    SolveJob,
    SolveOutcome,
    SolverError,
    SolverProcess,
    compact_nodes,
    compact_workload,
    solve,
)

log = logging.getLogger("gpupack.scheduler.planner")

# After a solve of d seconds the planner rests PLAN_REST x d before the next: at most a
# quarter of the time. In a burst every bind wakes it, and back-to-back solves (CP-SAT
# on two workers for up to its time limit, then the solver child's clean-up) took about
# as much CPU as the extender's verbs, on the cores kube-scheduler and the API server
# need: at 2,000 nodes, 1,000 pods at once, the extender's CPU went from 19.8 s to 10.0 s
# with the planner off (bench/e2e_throughput.py, bench/README.md "Where a burst's
# packing was lost"). The verbs answer a pod the latest plan does not hold greedily, as
# they do while any solve runs; a lone pod after a quiet spell waits for nothing.
PLAN_REST = 3.0


@dataclass(frozen=True)
class Plan:
    placements: Mapping[str, Placement] = field(default_factory=dict)
    unschedulable: Mapping[str, str] = field(default_factory=dict)  # pod key -> reason
    pending_class: Mapping[str, str] = field(default_factory=dict)  # pod key -> class
    status: str = "none"  # none | idle | greedy | OPTIMAL | FEASIBLE | ... | error
    solved_at: float | None = None  # clock time the solve finished
    solve_seconds: float = 0.0
    cache_version: int = -1
    fragmentation: float = 0.0
    error: str = ""

    def placement_of(self, pod_key: str) -> Placement | None:
        return self.placements.get(pod_key)


class Planner:
    """Keeps :attr:`plan` and :attr:`scorer` current in a background thread."""

    def __init__(
        self,
        cache: ClusterCache,
        policy: str = "gpupack",
        params: SolverParams | None = None,
        debounce_s: float = 0.5,
        min_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        max_batch: int = 64,
        in_process: bool = False,
        per_class: int = 16,
        max_nodes: int = PLAN_NODES,
        loop_metrics: LoopMetrics | None = None,
        rest: float = PLAN_REST,
    ) -> None:
        self.cache = cache
        self.policy_name = policy
        self.params = params or SolverParams(max_time_s=2.0, workers=2, seed=0)
        self.policy = make_policy(policy, self.params)
        self.max_batch = max_batch
        self.clock = clock
        self.plan = Plan()
        self._shapes: list[tuple[Shape, float]] = []
        self._keep_whole_nodes = False
        self._rare_key: tuple[object, ...] = ()
        self._capacity: tuple[tuple[NodeInfo, int], ...] = ()
        self._scorer_gen = 0
        self.scorer = ScorerRef(self.policy.make_scorer(Snapshot(nodes=())), 0,
                                name_sensitive=policy == "random", policy=policy,
                                source=Snapshot(nodes=()))
        self.solves = 0
        # Scorer replacements since start, by why (the shapes moved, the rare shapes
        # changed, or the held histogram of free sizes): each one makes the verbs score
        # every node again.
        self.replacements = {"shapes": 0, "rare_shapes": 0, "free_sizes": 0}
        # in_process: solve in the calling thread (tests, tools); else in the child.
        self.in_process = in_process
        # Plan over candidate nodes (pick_candidates): up to per_class nodes of a class
        # of equal nodes, max_nodes in all (0: no cap); per_class 0: every node.
        self.per_class = per_class
        self.max_nodes = max_nodes
        # Memos by node signature (ids are never reused for another state), kept for the
        # signatures some node has now: (shape, signature) -> the scorer's best key there
        # and the node's capacity for the shape (for the scorer of _rank_gen), and where
        # the shape does not fit, why (explain_by_class's misfit), both kept for the
        # shapes of the latest batch planned over candidates only (a shape no pod has any
        # more is not kept for ever); signature -> (fragmentation, idle GPU milli) for the
        # current shapes.
        self._rank_memo: dict[tuple[tuple[Any, ...], int], tuple[Score, int] | None] = {}
        self._why_memo: dict[tuple[tuple[Any, ...], int], tuple[str, bool]] = {}
        self._rank_gen = -1
        self._rank_scorer = self.scorer.scorer
        # Per node state: its fragmentation, its free GPU milli, and the histogram of
        # free sizes of its GPUs that take shares with their count (the sum-of-squares
        # price's, :func:`free_sizes`).
        self._frag_memo: dict[int, tuple[float, int, tuple[IntArray, int]]] = {}
        self._workload: tuple[tuple[PodRequest, int, int], ...] = ()
        self.last_job_nodes = 0  # nodes the latest job was planned over
        # Pending pods the latest plan that held them left unschedulable: a batch takes
        # them only where room is left (see make_job).
        self._unplaced: set[str] = set()
        self._solver: SolverProcess | None = None
        self._solver_lock = threading.Lock()  # _solver's creation against stop()
        # The planner's thread (scheduler.engine): woken by cache changes, it lets them
        # settle for debounce_s (a burst of watch events becomes one solve) and solves at
        # most every min_interval_s, since a solve can take its full time limit. After a
        # failed solve it tries again without waiting for a change (a dead solver child is
        # restarted by the next solve), backing off 1, 2, 4 .. BACKOFF_MAX_S seconds. No
        # solver child outlives the thread.
        self.loop = Loop("planner", self._turn, settle_s=debounce_s,
                         min_interval_s=min_interval_s, rest=rest, backoff=backoff_s,
                         retry=True, on_failure=lambda e, _: self._failed(e),
                         on_exit=self._shutdown_solver, log=log, clock=time.monotonic,
                         metrics=loop_metrics)
        cache.subscribe(self.loop.wake)

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (waiting for it at most ``timeout``) and the solver child. A
        thread still busy then starts no child any more (``_child``), and its solve in
        flight fails at once: the child is shut down for good, not restarted."""
        self.loop.stop()
        self.loop.join(timeout)
        self._shutdown_solver()

    def age(self) -> float | None:
        """Seconds since the latest plan was solved; None before the first."""
        at = self.plan.solved_at
        return None if at is None else max(0.0, self.clock() - at)

    def _turn(self) -> Outcome:
        if not self.cache.synced:
            return Outcome.IDLE
        self.solve_once()
        return Outcome.DONE

    def _failed(self, e: Exception) -> None:
        """Publish an error plan for a failed solve (the loop has logged it; it outlives
        anything raised here)."""
        self.plan = Plan(status="error", solved_at=self.clock(), error=str(e),
                         cache_version=self.cache.version)

    # ---- one solve -------------------------------------------------------------------------

    def solve_once(self) -> Plan:
        """Snapshot, refresh the scorer, pick the nodes to plan over, solve, publish.
        Called by the thread and tests."""
        job, version, frag = self.make_job()
        started = time.monotonic()
        # Nothing to plan: answered here (an empty job), no child is started or woken.
        local = self.in_process or not job.batch
        if not local and self.loop.stopped:
            # stop() came while the snapshot was taken: it has shut the solver down, or
            # found none, and no child may be started after it.
            return self.plan
        outcome = solve(job) if local else self._child().solve(job, self.timeout_s())
        plan = self._publish(outcome, job, version, frag, time.monotonic() - started)
        return plan

    def make_job(self) -> tuple[SolveJob, int, float]:
        """The job for the solver, the cache version it was taken at, and the cluster's
        fragmentation figure (taken here, where every node's signature is known: one
        evaluation per node state, not per node).

        The job holds only what the plan is made over: for a batch without group members
        the candidate nodes (:func:`pick_candidates`, at most ``max_nodes``) and the pods
        on them, so the solver child's memory does not grow with the cluster. A batch with
        group members is planned over every node: a group's topology domains and the
        exclusive domains taken by running groups are read from all nodes and pods. An
        empty batch holds no nodes."""
        cache = self.cache
        version = cache.version
        snapshot = cache.snapshot()
        self._refresh_scorer(snapshot)  # outside the lock: it reads every pod's shape
        batch = snapshot.pending
        self._unplaced.intersection_update(p.key for p in batch)
        if len(batch) > self.max_batch:
            # A bounded batch keeps every solve bounded; pods beyond it, lower priority
            # or newer, get the greedy answer until an earlier batch has been bound. Pods
            # the latest plan that held them could not place come last, whatever their
            # priority: a few pods that fit no node (too many GPUs, a selector no node
            # matches) at a high priority otherwise filled every batch, and the pods
            # behind them were never planned. They are planned again where room is left
            # (and kept last until a plan places them); the verbs answer them meanwhile.
            ordered = order_pods(batch)
            batch = tuple(([p for p in ordered if p.key not in self._unplaced]
                           + [p for p in ordered if p.key in self._unplaced])[: self.max_batch])
        capped = bool(batch) and bool(self.per_class) and not any(p.group for p in batch)
        shapes = bare_shapes(batch) if capped else {}
        if self._rank_gen != self.scorer.gen:
            # A scorer of the planner's own (the verbs' one keeps a memo by node state
            # version that copies must not touch), rebuilt from the same workload.
            self._rank_memo.clear()
            self._why_memo.clear()
            self._rank_gen = self.scorer.gen
            self._rank_scorer = holding(self.policy.make_scorer(
                self.scorer.source or Snapshot(nodes=())), self.scorer.free_sizes)
        if capped:
            # Only this batch's shapes are kept: at most max_batch shapes for each node
            # state (one-off shapes of pods long gone stayed for as long as their node
            # states did, the typical shapes' often for ever).
            self._rank_memo = {k: v for k, v in self._rank_memo.items() if k[0] in shapes}
            self._why_memo = {k: v for k, v in self._why_memo.items() if k[0] in shapes}
        with cache.lock:
            # Under the lock only reads: the signatures, the (immutable) NodeInfos, and a
            # node's pods for each node state not evaluated yet; the evaluations run on
            # copies after it (a first solve evaluates every state: ~0.2 s at 5,000 nodes).
            signatures = dict(cache.signatures())
            infos = {name: n.info for name, n in cache.state.nodes.items()}
            new: dict[int, tuple[NodeInfo, tuple[tuple[PodRequest, Placement], ...]]] = {}
            for name, sid in signatures.items():
                if sid not in new and (
                        sid not in self._frag_memo
                        or any((k, sid) not in self._rank_memo for k in shapes)):
                    new[sid] = (infos[name], tuple(cache.pods_on(name)))
        self._evaluate(new, shapes)
        frag = self._fragmentation(signatures)
        self._refresh_free_sizes(signatures)
        if not batch:
            job = SolveJob(self.policy_name, self.params, Snapshot(nodes=()), ())
        elif capped:
            names, placeable = pick_candidates(
                lambda m: infos[m].labels, signatures, batch, self.per_class, self.max_nodes,
                lambda pod, sid, _node: self._rank_memo[shape_key(pod), sid])
            with cache.lock:
                # The nodes and pods as they are now: pods bound or assumed since the
                # snapshot are left out of the batch (they are counted on the nodes now:
                # a pod assumed at its bind in between was both, and the plan was refused
                # as placing it twice).
                batch = tuple(p for p in batch if cache.pending_pod(p.key) is not None
                              and cache.counted(p.key) is None)
                names = [n for n in names if n in cache.state.nodes]
                nodes = tuple(cache.state.nodes[n].info for n in names)
                running = tuple(r for n in names for r in cache.pods_on(n))
            unplaceable = [p for p in batch if p.key not in placeable]
            job = SolveJob(self.policy_name, self.params, Snapshot(nodes, running, ()),
                           batch, self._workload, frozenset(p.key for p in unplaceable),
                           self._explain(unplaceable, signatures, infos),
                           free_sizes=self.scorer.free_sizes, capacity=self._capacity)
        else:
            job = SolveJob(self.policy_name, self.params,
                           Snapshot(snapshot.nodes, snapshot.running, ()), tuple(batch),
                           self._workload, free_sizes=self.scorer.free_sizes,
                           capacity=self._capacity)
        self.last_job_nodes = len(job.snapshot.nodes)
        return job, version, frag

    def _evaluate(self, new: Mapping[int, tuple[NodeInfo, Sequence[tuple[PodRequest,
                                                                             Placement]]]],
                  shapes: Mapping[tuple[Any, ...], PodRequest]) -> None:
        """Fill the memos for node states not evaluated yet, each on a copy of one node
        in that state (its NodeInfo and pods): its fragmentation figures, and per batch
        shape the planner's scorer's best key there and how many pods of the shape the
        node takes (:func:`node_capacity`), None where the shape does not fit."""
        for sid, (info, pods) in new.items():
            copy = ClusterState(Snapshot((info,), tuple(pods)))
            n = copy.nodes[info.name]
            if sid not in self._frag_memo:
                self._frag_memo[sid] = (
                    node_fragmentation(n, self._shapes) if self._shapes else 0.0,
                    sum(g.free_milli for g in n.gpus), free_sizes([share_gpu_free(n)]))
            for k, pod in shapes.items():
                if (k, sid) in self._rank_memo:
                    continue
                key = best_key(copy, pod, info.name, self._rank_scorer)
                self._rank_memo[k, sid] = None if key is None else (
                    key, node_capacity(info, pods, pod))
                if key is None:
                    # Why not (explain_by_class): whether the node could never take it or
                    # is cordoned, either one before the node selector (the labels).
                    never = copy.unresolvable(pod, info.name)
                    self._why_memo[k, sid] = (
                        (never, True) if never is not None
                        else (copy.reason(pod, info.name), info.unschedulable))

    def _explain(self, pods: Sequence[PodRequest], signatures: Mapping[str, int],
                 infos: Mapping[str, NodeInfo]) -> tuple[tuple[str, str], ...]:
        """(pod key, reason) for the batch pods that fit no node, over the whole
        cluster (:func:`explain_by_class`, from the memos of ``_evaluate``): the plan
        over candidate nodes holds none of the nodes they were refused by."""
        if not pods:
            return ()
        classes: dict[int, list[str]] = {}
        for name, sid in signatures.items():
            classes.setdefault(sid, []).append(name)
        out: dict[tuple[Any, ...], str] = {}  # one text per shape, its selector included
        reasons = []
        for pod in pods:
            # (the selector in its order: fits_node names the first pair a node misses)
            k = (*shape_key(pod), tuple(pod.node_selector.items()))
            if k not in out:
                bare = shape_key(replace(pod, node_selector={}))
                misfit = {sid: w for (b, sid), w in self._why_memo.items() if b == bare}
                out[k] = explain_by_class(pod, classes, lambda m: infos[m].labels, misfit)
            reasons.append((pod.key, out[k]))
        return tuple(reasons)

    def _fragmentation(self, signatures: Mapping[str, int]) -> float:
        """:func:`packing.policies.fgd.cluster_fragmentation` of the cache's state: the
        share of idle GPU capacity the typical shapes cannot use, from each node state's
        memoized figures. Also drops the memos' entries of signatures no node has now."""
        live = set(signatures.values())
        self._rank_memo = {k: v for k, v in self._rank_memo.items() if k[1] in live}
        self._why_memo = {k: v for k, v in self._why_memo.items() if k[1] in live}
        self._frag_memo = {k: v for k, v in self._frag_memo.items() if k in live}
        if not self._shapes:
            return 0.0
        frag = idle = 0.0
        for sid in signatures.values():
            f, i, _ = self._frag_memo[sid]
            frag += f
            idle += i
        return frag / idle if idle else 0.0

    def timeout_s(self) -> float:
        """How long to wait for the child: the time limit plus a generous margin (the
        greedy passes, model building and the fragmentation figure come on top)."""
        return 4 * self.params.max_time_s + 120.0

    def _child(self) -> SolverProcess:
        with self._solver_lock:
            if self.loop.stopped:  # stop() shuts the solver down once, for good
                raise SolverError("the planner is stopped: no solver child is started")
            if self._solver is None:
                self._solver = SolverProcess()
            return self._solver

    def _shutdown_solver(self) -> None:
        with self._solver_lock:
            solver, self._solver = self._solver, None
        if solver is not None:
            solver.shutdown()

    @property
    def solver_pid(self) -> int | None:
        return None if self._solver is None else self._solver.pid

    def _publish(self, outcome: SolveOutcome, job: SolveJob, version: int, frag: float,
                 wall: float) -> Plan:
        del wall  # the solve's own time (outcome.seconds) is what the metric reports
        plan = Plan(
            placements={p.pod: p for p in outcome.placements},
            unschedulable=dict(outcome.unschedulable),
            pending_class={p.key: p.klass for p in job.batch},
            status=outcome.status,
            solved_at=self.clock(),
            solve_seconds=outcome.seconds,
            cache_version=version,
            fragmentation=frag,
        )
        self.plan = plan
        self.solves += 1
        for p in job.batch:  # what the next batches take last (make_job)
            if p.key in plan.unschedulable:
                self._unplaced.add(p.key)
            else:
                self._unplaced.discard(p.key)
        return plan

    def _refresh_scorer(self, snapshot: Snapshot) -> None:
        counts, one_each = shape_census(workload_of(snapshot))  # the one pass over pods
        shapes = typical_of(counts)
        # The gpupack scorer's other input: whether whole nodes are kept for groups (a
        # clique label or the first group pod can come without any shape changing).
        keep = keeps_whole_nodes(snapshot)
        # And gpupack's rare-shape price: the rare shapes, from every shape of the
        # workload and the nodes' capacity (a rare shape is seldom a typical one).
        rare = (rare_shapes_key(Snapshot(snapshot.nodes, pending=tuple(one_each)))
                if self.policy_name.startswith("gpupack") else ())
        moved = not close_shapes(shapes, self._shapes) or keep != self._keep_whole_nodes
        if not moved and rare == self._rare_key:
            return
        self._shapes = shapes
        self._keep_whole_nodes = keep
        self._rare_key = rare
        self._frag_memo = {}
        self._scorer_gen += 1
        self.replacements["shapes" if moved else "rare_shapes"] += 1
        source = shape_workload(snapshot)
        self._workload = compact_workload(source)
        self._capacity = compact_nodes(source)
        held = self.scorer.free_sizes  # a new workload keeps the histogram held
        self.scorer = ScorerRef(holding(self.policy.make_scorer(snapshot), held),
                                self._scorer_gen, free_sizes=held,
                                name_sensitive=self.policy_name == "random",
                                policy=self.policy_name, source=source)

    def _refresh_free_sizes(self, signatures: Mapping[str, int]) -> None:
        """A new scorer generation holding the cluster's histogram of free sizes once it
        has drifted from the one the scorer holds (gpupack's sum-of-squares price,
        :meth:`GpupackScorer.free_sizes_due`; the openb replay checks the same rule after
        every placement). Summed from the node states' memoized histograms, each times
        the nodes in that state (a large cluster is a few node states)."""
        scorer = self.scorer.scorer
        if not isinstance(scorer, GpupackScorer):
            return
        counts, gpus = np.zeros(BUCKETS, dtype=np.int64), 0
        for sid, nodes in Counter(signatures.values()).items():
            c, g = self._frag_memo[sid][2]
            counts += nodes * c
            gpus += nodes * g
        if not scorer.free_sizes_due(counts, gpus):
            return
        self._scorer_gen += 1
        self.replacements["free_sizes"] += 1
        self.scorer = replace(self.scorer, scorer=scorer.at_free_sizes(counts, gpus),
                              gen=self._scorer_gen,
                              free_sizes=(tuple(int(c) for c in counts), gpus))
