"""Background warming of the verbs' memo: answers ready before a request asks.

A memo miss is the first time a (pod shape, node state) pair is seen: the node's options
are enumerated and, for prioritize, every option is scored (the FGD gradient over the
typical shapes: up to ~15 ms for a MIG pod on an 8-GPU reconfigurable node). Every bind
puts one node into a state that may be new, so without warming the next request that
names that node pays it.

The warmer thread wakes on cache changes (and every ``interval_s`` to catch a new
scorer), finds the (shape, signature) pairs of pending pods' shapes that have no answer
(or a score from an older scorer), and has them computed on a copy of one node in that
state. Only the copies and the final inserts happen under the cache lock.

*Successors*: a bind puts its node into the state "this state plus the pod at the best
option" (bind reuses the memoized best option), and kube-scheduler's next cycle follows
at once, before a sweep could see the new state. So for every answer that fits, the
warmer also builds that successor state on the copy, interns its signature in the cache
(:meth:`ClusterCache.intern_signature`) and warms the pending shapes on it: when the bind
lands, the node's new signature already has answers. One step ahead only; each
successor signature is expanded once.

Where: by default in a warm child process (``spawn``, SCHED_IDLE, like the solver): in this
process the evaluations would hold the GIL and every request thread, echo included,
would wait for it at each hand-off. The child rebuilds the same scorer from the policy's
name and the workload it was made from (:attr:`ScorerRef.source`); the thread sends
batches of (pod, node state) and waits, the GIL free. In-process warming (tests, or a
scorer that cannot be rebuilt) steps aside instead: before each unit of work it waits
while a request is in flight (``busy``), up to ``max_pause_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any

from kube.cache import ClusterCache
from kube.signatures import node_signature
from packing.cpsat import SolverParams
from packing.model import Placement, PodRequest, Snapshot
from packing.scoring import Scorer
from packing.state import ClusterState, GpuState, NodeState, PlacementError
from scheduler.backoff import doubling
from scheduler.child import (
    ChildGone,
    ChildProcess,
    ChildTimeout,
    background,
    pickle_chunks,
    serve_messages,
    unpickle_chunks,
)
from scheduler.engine import Loop, LoopMetrics, Outcome
from scheduler.memo.decide import (
    Memo,
    NodeEval,
    ScorerRef,
    evaluate_fit,
    holding,
    make_policy,
    scored,
    selector_free,
    shape_key,
)

log = logging.getLogger("gpupack.scheduler.warm")

# (shape, selector-free pod, signature, node name or a private node state, fit known)
Work = tuple[tuple[object, ...], PodRequest, int, "str | NodeState", bool]

MAX_SHAPES = 16  # pending shapes warmed, first come (the queue's head matters most)
AHEAD_KEY = "gpupack.io/ahead"  # the stand-in pod of a successor (identities are not in
# signatures, so any key gives the state a bind of the real pod gives)
MAX_EXPANDED = 50_000  # successor signatures remembered as expanded (then forgotten)
BATCH = 16  # (pod, node state) pairs per message to the warm child
NICE = 10


def copy_state(n: NodeState) -> NodeState:
    """``n`` sharing nothing mutable (the cache's node keeps changing under its lock)."""
    gpus = [
        GpuState(g.info, g.whole_owner, dict(g.instances), dict(g.shared_owners),
                 g.reconfigurable, g.converted)
        for g in n.gpus
    ]
    return NodeState(n.info, n.cpu_free, n.mem_free, gpus, dict(n.pods))


def alone(n: NodeState) -> ClusterState:
    """A one-node ClusterState around ``n`` (fit, reasons and scores are per node)."""
    state = ClusterState(Snapshot(nodes=()))
    state.nodes[n.info.name] = n
    return state


def evaluate(n: NodeState, base: PodRequest, known: bool, scorer: Scorer | None, gen: int,
             pause: Callable[[], None] | None = None) -> NodeEval:
    """Fit (unless ``known`` to fit) and, with a scorer, the best score of ``base`` on
    the private node ``n``."""
    state = alone(n)
    name = n.info.name
    ev = NodeEval(True) if known else evaluate_fit(state, base, name)
    if ev.fits and scorer is not None:
        ev.set_score(scored(state, base, name, scorer, pause), gen)
    return ev


def _best_at(ev: NodeEval | None, gen: int) -> Any:
    """The best option of ``ev`` scored by scorer ``gen``: None when the pod does not fit
    (or fits with no option), False when that answer is not there yet."""
    if ev is None:
        return False
    if not ev.fits:
        return None
    if ev.score_gen == gen:
        return ev.best_at
    if ev.other is not None and ev.other[0] == gen:
        return ev.other[3]
    return False


# ---- the warm child ------------------------------------------------------------------------


class _WarmHandler:
    """The warm child's state (the loaded scorer) and its answer to each message."""

    def __init__(self) -> None:
        self.gen = -1
        self.scorer: Scorer | None = None

    def __call__(self, msg: tuple[Any, ...]) -> Any:
        if msg[0] == "scorer":
            _, gen, policy, running, pending, free_sizes, nodes = msg
            source = Snapshot(nodes, unpickle_chunks(running), unpickle_chunks(pending))
            self.gen, self.scorer = gen, holding(
                make_policy(policy, SolverParams()).make_scorer(source), free_sizes)
            return None
        if msg[0] == "eval":
            _, want, items = msg
            scorer = self.scorer
            if want != self.gen or scorer is None:
                raise RuntimeError(f"scorer generation {want} asked, {self.gen} loaded")
            return [evaluate(n, base, known, scorer if score else None, self.gen)
                    for base, n, known, score in items]
        raise RuntimeError(f"unknown message {msg[0]!r}")


def warm_main(conn: Connection) -> None:
    """The child's loop. Messages, each answered with ("ok", value) or ("error", text):
    ("scorer", gen, policy, running chunks, pending chunks, free sizes, capacity-class
    stand-in nodes) -> None;
    ("eval", gen, [(pod, node state, known, score)]) -> [NodeEval]."""
    background()
    serve_messages(conn, _WarmHandler())


class WarmChild(ChildProcess):
    """The warm child process, started on first use and restarted when it dies."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        super().__init__(warm_main, "gpupack-warm", error=RuntimeError)
        self.gen = -1  # scorer generation loaded in the child
        self.timeout_s = timeout_s

    def call(self, msg: tuple[Any, ...]) -> Any:
        try:
            return self.request(msg, self.timeout_s)
        except ChildTimeout:
            raise RuntimeError(
                f"warm child failed: warm child gave no answer in {self.timeout_s:.0f} s"
            ) from None
        except ChildGone as e:
            raise RuntimeError(f"warm child failed: {e}") from None

    def load_scorer(self, ref: ScorerRef) -> None:
        if ref.gen == self.gen and self.running():
            return
        assert ref.source is not None
        self.gen = -1
        self.call(("scorer", ref.gen, ref.policy, pickle_chunks(ref.source.running),
                   pickle_chunks(ref.source.pending), ref.free_sizes, ref.source.nodes))
        self.gen = ref.gen

    def close(self) -> None:
        super().close()
        self.gen = -1


class Warmer:
    """A daemon thread filling ``memo`` for pending shapes x node signatures."""

    def __init__(self, cache: ClusterCache, memo: Memo, scorer: Callable[[], ScorerRef],
                 interval_s: float = 1.0, settle_s: float = 0.001,
                 busy: Callable[[], bool] | None = None, max_pause_s: float = 0.05,
                 in_process: bool = False, ahead: bool = True,
                 loop_metrics: LoopMetrics | None = None) -> None:
        self.cache = cache
        self.in_process = in_process
        self.ahead = ahead  # also warm the states binds are about to create
        self.child: WarmChild | None = None
        self.busy = busy
        self.max_pause_s = max_pause_s
        self.memo = memo
        self.scorer = scorer
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.warmed = 0  # answers computed here (fits and scores)
        self.max_retry_s = 60.0
        # The warmer's thread (scheduler.engine): a pass on every cache change, and at
        # least every interval_s (a new scorer), once a burst of events has landed
        # (settle_s). A failed pass stops the child; without a pause, every cache event
        # (many a second on a busy cluster) would start a fresh one for the same
        # failure, so the next pass waits interval_s doubled per failure in a row, at
        # most max_retry_s (retry_delay_s). Meanwhile the verbs compute what the memo
        # lacks themselves.
        self.loop = Loop("warm", self._turn, poll_s=interval_s, settle_s=settle_s,
                         backoff=lambda _: self.retry_delay_s(), log=log,
                         metrics=loop_metrics)
        self._seen: tuple[int, int] = (-1, -1)  # (cache version, scorer gen) last swept
        self._swept: tuple[int, frozenset[tuple[object, ...]]] | None = None  # gen, shapes
        self._shape_of: dict[str, tuple[PodRequest, tuple[object, ...], PodRequest]] = {}
        # (scorer gen, signature) of node states whose successors were made
        self._expanded_from: set[tuple[int, int]] = set()
        self._shapes_now: dict[tuple[object, ...], PodRequest] = {}  # of the last _work
        self._reps_now: dict[int, str] = {}  # signature -> a node, of the last _work
        self.successors = 0  # successor states whose answers were warmed ahead of a bind
        self.active: ScorerRef | None = None  # the latest scorer whose warming finished
        self.max_lag_s = 30.0
        self._latest_gen = -1
        self._latest_since = time.monotonic()
        cache.subscribe(self.loop.wake)

    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.loop.stop()
        self.loop.join(timeout)
        if self.child is not None:
            self.child.close()

    def _turn(self) -> Outcome:
        self.sweep()
        return Outcome.DONE

    @property
    def failures(self) -> int:
        """Passes failed in a row (the pause before the next grows with them)."""
        return self.loop.failures

    @failures.setter
    def failures(self, n: int) -> None:
        self.loop.failures = n

    def retry_delay_s(self) -> float:
        """Seconds to wait after ``failures`` passes failed in a row: ``interval_s``
        doubled per failure, at most ``max_retry_s``."""
        if self.failures <= 0:
            return 0.0
        return doubling(self.interval_s, self.failures, self.max_retry_s)

    def pause(self) -> None:
        """Wait while a request is in flight (at most ``max_pause_s``)."""
        busy = self.busy
        if busy is None or not busy():
            return
        deadline = time.monotonic() + self.max_pause_s
        while busy() and time.monotonic() < deadline:
            time.sleep(0.0002)

    def _shapes(self, pending: list[PodRequest]) -> dict[tuple[object, ...], PodRequest]:
        """Distinct selector-free shapes of the pending pods (per-pod results reused)."""
        known = self._shape_of
        fresh: dict[str, tuple[PodRequest, tuple[object, ...], PodRequest]] = {}
        shapes: dict[tuple[object, ...], PodRequest] = {}
        for pod in pending:
            item = known.get(pod.key)
            if item is None or item[0] is not pod:
                base = selector_free(pod)
                item = (pod, shape_key(base), base)
            fresh[pod.key] = item
            if len(shapes) < MAX_SHAPES:
                shapes.setdefault(item[1], item[2])
        self._shape_of = fresh
        return shapes

    def _work(self, ref: ScorerRef) -> list[Work]:
        """(shape, selector-free pod, signature, a node in that state, fit known) to do.

        Only copies are taken under the lock, no evaluation. A full pass over every
        signature happens when the scorer or the set of pending shapes changes; else only
        the nodes whose signature changed since the last pass are looked at."""
        self._reps_now = {}
        with self.cache.lock:
            if not self.cache.synced:
                return []
            mark = (self.cache.version, ref.gen)
            if mark == self._seen:
                return []
            self._seen = mark
            pending = self.cache.pending()
            changes = self.cache.drain_signature_changes()
        shapes = self._shapes(pending)
        swept = (ref.gen, frozenset(shapes))
        if changes is None or swept != self._swept:
            with self.cache.lock:
                changes = list(self.cache.signatures().items())
            self._swept = swept
        self._shapes_now = shapes
        reps: dict[int, str] = {}
        for name, sig in changes:
            reps.setdefault(sig, name)
        self._reps_now = reps
        work: list[Work] = []
        tables = self.memo.tables
        for shape, base in shapes.items():
            table = tables.get(shape, {})
            for sig, name in reps.items():
                ev = table.get(sig)
                if ev is None:
                    work.append((shape, base, sig, name, False))
                elif ev.fits and not ev.knows(ref.gen) and not ref.name_sensitive:
                    work.append((shape, base, sig, name, True))
        return work

    def current(self) -> ScorerRef:
        """The scorer the verbs should use now.

        A new scorer (the planner replaces it when the workload's shapes move) makes every
        memoized score stale; switching the verbs to it at once would make the next
        requests re-score every node they name. While the warmer runs, the verbs keep the
        scorer it has finished warming (``active``) until the new one is warmed, or for
        at most ``max_lag_s`` if warming falls behind."""
        latest = self.scorer()
        active = self.active
        if not self.loop.started or active is None or active.gen == latest.gen:
            return latest
        if time.monotonic() - self._latest_since > self.max_lag_s:
            return latest
        return active

    def sweep(self) -> int:
        """One pass over what is missing; returns how many answers were computed."""
        ref = self.scorer()
        if self._latest_gen != ref.gen:
            self._latest_gen, self._latest_since = ref.gen, time.monotonic()
        remote = not self.in_process and ref.policy != "" and ref.source is not None
        done = 0
        step = BATCH if remote else 1
        try:
            work = self._work(ref)
            for i in range(0, len(work), step):
                if self.loop.stopped:
                    return done
                done += self._batch(work[i:i + step], ref, remote)
            ahead = self._successors(ref)
            for i in range(0, len(ahead), step):
                if self.loop.stopped:
                    return done
                done += self._batch(ahead[i:i + step], ref, remote)
        except Exception:
            self._seen, self._swept = (-1, -1), None  # the next pass starts over, in full
            if self.child is not None:
                self.child.close()
            raise
        finally:
            self.warmed += done
        if self.cache.synced:
            self.active = ref  # every pending shape is scored with it now
        return done

    def _successors(self, ref: ScorerRef) -> list[Work]:
        """Work on the states binds would create from the node states the last
        :meth:`_work` looked at (see the module docstring): for each pending shape with
        a best option there, that option is applied to a copy of the node, and the
        pending shapes without an answer for the resulting signature are returned, each
        with the copy to evaluate on. Successors are made from real node states only
        (one step ahead), once per state and scorer."""
        if not self.ahead or ref.name_sensitive:
            return []  # (name-sensitive: answers depend on names, no state stands for another)
        shapes = self._shapes_now
        reps = [(sig, name) for sig, name in self._reps_now.items()
                if (ref.gen, sig) not in self._expanded_from]
        if not reps or not shapes:
            return []
        tables = self.memo.tables
        with self.cache.lock:
            sigs = self.cache.signatures()
            nodes = self.cache.state.nodes
            states = []
            for sig, name in reps:
                n = nodes.get(name)
                if n is not None and sigs.get(name) == sig:
                    states.append((sig, copy_state(n),
                                   [(base, _best_at(tables.get(shape, {}).get(sig), ref.gen))
                                    for shape, base in shapes.items()]))
        if len(self._expanded_from) >= MAX_EXPANDED:
            self._expanded_from.clear()
        out: list[Work] = []
        queued: set[int] = set()
        for sig, n, answers in states:
            if any(best is False for _, best in answers):
                continue  # not all answers are in yet: expanded by a later sweep
            self._expanded_from.add((ref.gen, sig))
            for base, best in answers:
                if best is None or best is False:
                    continue
                after = copy_state(n)
                # Under a key of its own: the same shape is evaluated on the result next.
                stand_in = replace(base, key=AHEAD_KEY, uid="")
                try:
                    alone(after).apply(stand_in, Placement(AHEAD_KEY, n.info.name, *best))
                except PlacementError:
                    continue
                sid = self.cache.intern_signature(node_signature(after))
                if sid in queued:
                    continue
                queued.add(sid)
                self.successors += 1
                for shape, other in shapes.items():
                    known = tables.get(shape, {}).get(sid)
                    if known is None:
                        out.append((shape, other, sid, after, False))
                    elif known.fits and not known.knows(ref.gen):  # an older scorer's
                        out.append((shape, other, sid, after, True))
        return out

    def _batch(self, items: list[Work], ref: ScorerRef, remote: bool) -> int:
        """Compute ``items``; returns how many answers were computed."""
        score = not ref.name_sensitive
        if not remote:
            self.pause()
        with self.cache.lock:
            sigs = self.cache.signatures()
            nodes = self.cache.state.nodes
            todo = []
            for shape, base, sig, where, known in items:
                if isinstance(where, NodeState):  # a successor: private, nobody's yet
                    todo.append((shape, base, sig, where, known))
                    continue
                n = nodes.get(where)
                if n is not None and sigs.get(where) == sig:  # else: the next sweep sees it
                    todo.append((shape, base, sig, copy_state(n), known))
        if not todo:
            return 0
        if remote:
            if self.child is None:
                self.child = WarmChild()
            self.child.load_scorer(ref)
            evs = self.child.call(("eval", ref.gen, [(b, n, k, score) for _, b, _, n, k in todo]))
        else:
            evs = [evaluate(n, b, k, ref.scorer if score else None, ref.gen, self.pause)
                   for _, b, _, n, k in todo]
            self.pause()
        with self.cache.lock:
            for (shape, _, sig, _, _), ev in zip(todo, evs, strict=True):
                self.memo.put(shape, sig, ev)
        return len(todo)
