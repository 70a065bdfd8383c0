"""The background planner: a placement plan for every pending pod of our scheduler.

A daemon thread waits for cache changes, lets them settle for ``debounce_s`` (a burst of
watch events becomes one solve), takes a snapshot and has it solved with the configured
policy (``gpupack``: greedy portfolio, then CP-SAT under an explicit time limit, worker
count and seed). The solve runs in a separate solver process (:mod:`scheduler.solve`):
at 1,000-5,000 nodes it is seconds of CPU-bound Python, which in this process would hold
the GIL away from the request threads. The thread only packs the snapshot and waits for
the answer. The verbs read the latest published :class:`Plan` without waiting; a pod
the plan does not know yet gets the greedy answer from the scorer.

The planner also publishes the policy's scorer for the verbs. The FGD-based scorers
depend on the workload's typical shapes and their frequencies, which move a little with
every pod; the scorer is replaced only when the shapes change or a frequency moves by
more than ``SHAPE_TOLERANCE``, because each replacement invalidates every memoized
per-node score (a latency spike on the next requests) for no real change in preference.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kube.cache import ClusterCache
from packing.cpsat import SolverParams
from packing.model import Placement, Snapshot
from packing.policies.fgd import Shape, shape_workload, typical_shapes, workload_of
from packing.scoring import order_pods
from scheduler.solve import SolveJob, SolveOutcome, SolverProcess, make_policy, solve
from scheduler.verbs import ScorerRef

log = logging.getLogger("gpupack.scheduler.planner")

SHAPE_TOLERANCE = 0.05


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
    ) -> None:
        self.cache = cache
        self.policy_name = policy
        self.params = params or SolverParams(max_time_s=2.0, workers=2, seed=0)
        self.policy = make_policy(policy, self.params)
        self.debounce_s = debounce_s
        self.min_interval_s = min_interval_s
        self.max_batch = max_batch
        self.clock = clock
        self.plan = Plan()
        self._shapes: list[tuple[Shape, float]] = []
        self._scorer_gen = 0
        self.scorer = ScorerRef(self.policy.make_scorer(Snapshot(nodes=())), 0,
                                name_sensitive=policy == "random", policy=policy,
                                source=Snapshot(nodes=()))
        self.solves = 0
        # in_process: solve in the calling thread (tests, tools); else in the child.
        self.in_process = in_process
        # Plan over candidate nodes: up to this many per class of equal nodes (0: all).
        self.per_class = per_class
        self._solver: SolverProcess | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        cache.subscribe(self._wake.set)

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="gpupack-planner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._solver is not None:
            self._solver.close()

    def age(self) -> float | None:
        """Seconds since the latest plan was solved; None before the first."""
        at = self.plan.solved_at
        return None if at is None else max(0.0, self.clock() - at)

    def _loop(self) -> None:
        last = 0.0
        while not self._stop.is_set():
            self._wake.wait()
            if self._stop.is_set():
                return
            # Debounce: solve once the events stop coming for a moment, and not more
            # often than min_interval_s, since a solve can take its full time limit.
            time.sleep(self.debounce_s)
            wait = self.min_interval_s - (time.monotonic() - last)
            if wait > 0:
                self._stop.wait(wait)
            self._wake.clear()
            if not self.cache.synced:
                continue
            last = time.monotonic()
            try:
                self.solve_once()
            except Exception as e:  # a planner bug must not kill the extender: log, retry
                log.exception("planning failed")
                self.plan = Plan(status="error", solved_at=self.clock(), error=str(e),
                                 cache_version=self.cache.version)

    # ---- one solve -------------------------------------------------------------------------

    def solve_once(self) -> Plan:
        """Snapshot, refresh the scorer, solve, publish. Called by the thread and tests."""
        version = self.cache.version
        snapshot = self.cache.snapshot()
        self._refresh_scorer(snapshot)
        batch = snapshot.pending
        if len(batch) > self.max_batch:
            # A bounded batch keeps every solve bounded; pods beyond it, lower priority
            # or newer, get the greedy answer until an earlier batch has been bound.
            batch = tuple(order_pods(batch)[: self.max_batch])
        job = SolveJob(self.policy_name, self.params, snapshot, tuple(batch),
                       tuple(self._shapes), self.per_class)
        started = time.monotonic()
        outcome = solve(job) if self.in_process else self._child().solve(job, self.timeout_s())
        plan = self._publish(outcome, job, version, time.monotonic() - started)
        return plan

    def timeout_s(self) -> float:
        """How long to wait for the child: the time limit plus a generous margin (the
        greedy passes, model building and the fragmentation figure come on top)."""
        return 4 * self.params.max_time_s + 120.0

    def _child(self) -> SolverProcess:
        if self._solver is None:
            self._solver = SolverProcess()
        return self._solver

    @property
    def solver_pid(self) -> int | None:
        return None if self._solver is None else self._solver.pid

    def _publish(self, outcome: SolveOutcome, job: SolveJob, version: int, wall: float) -> Plan:
        del wall  # the solve's own time (outcome.seconds) is what the metric reports
        plan = Plan(
            placements={p.pod: p for p in outcome.placements},
            unschedulable=dict(outcome.unschedulable),
            pending_class={p.key: p.klass for p in job.batch},
            status=outcome.status,
            solved_at=self.clock(),
            solve_seconds=outcome.seconds,
            cache_version=version,
            fragmentation=outcome.fragmentation,
        )
        self.plan = plan
        self.solves += 1
        return plan

    def _refresh_scorer(self, snapshot: Snapshot) -> None:
        shapes = typical_shapes(workload_of(snapshot))
        if _close(shapes, self._shapes):
            return
        self._shapes = shapes
        self._scorer_gen += 1
        self.scorer = ScorerRef(self.policy.make_scorer(snapshot), self._scorer_gen,
                                name_sensitive=self.policy_name == "random",
                                policy=self.policy_name,
                                source=shape_workload(snapshot))


def _close(a: list[tuple[Shape, float]], b: list[tuple[Shape, float]]) -> bool:
    if Counter(s for s, _ in a) != Counter(s for s, _ in b):
        return False
    wb = dict(b)
    return all(abs(w - wb[s]) <= SHAPE_TOLERANCE for s, w in a)
