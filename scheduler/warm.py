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
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from packing.cpsat import SolverParams
from packing.model import PodRequest, Snapshot
from packing.policies.greedy import Scorer
from packing.state import ClusterState, GpuState, NodeState
from scheduler.cache import ClusterCache
from scheduler.solve import start_child
from scheduler.verbs import (
    Memo,
    NodeEval,
    ScorerRef,
    evaluate_fit,
    scored,
    selector_free,
    shape_key,
)

log = logging.getLogger("gpupack.scheduler.warm")

MAX_SHAPES = 16  # pending shapes warmed, first come (the queue's head matters most)
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


def copy_node(n: NodeState) -> ClusterState:
    """A one-node ClusterState in the same state as ``n``, sharing nothing mutable."""
    return alone(copy_state(n))


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


# ---- the warm child ------------------------------------------------------------------------


def warm_main(conn: Connection) -> None:
    """The child's loop. Messages, each answered with ("ok", value) or ("error", text):
    ("scorer", gen, policy, running chunks, pending chunks) -> None;
    ("eval", gen, [(pod, node state, known, score)]) -> [NodeEval]."""
    from scheduler.solve import background, make_policy, unpickle_chunks

    background()
    gen, scorer = -1, None
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if msg[0] == "scorer":
                _, gen, policy, running, pending = msg
                source = Snapshot((), unpickle_chunks(running), unpickle_chunks(pending))
                scorer = make_policy(policy, SolverParams()).make_scorer(source)
                reply: tuple[str, Any] = ("ok", None)
            elif msg[0] == "eval":
                _, want, items = msg
                if want != gen or scorer is None:
                    raise RuntimeError(f"scorer generation {want} asked, {gen} loaded")
                reply = ("ok", [evaluate(n, base, known, scorer if score else None, gen)
                                for base, n, known, score in items])
            else:
                raise RuntimeError(f"unknown message {msg[0]!r}")
        except Exception as e:
            reply = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


class WarmChild:
    """The warm child process, started on first use and restarted when it dies."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self._ctx: Any = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Connection | None = None
        self.gen = -1  # scorer generation loaded in the child
        self.timeout_s = timeout_s

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else int(self._proc.pid)

    def call(self, msg: tuple[Any, ...]) -> Any:
        if self._proc is None or not self._proc.is_alive() or self._conn is None:
            self.close()
            self._proc, self._conn = start_child(self._ctx, warm_main, "gpupack-warm",
                                                 RuntimeError)
        conn = self._conn
        try:
            conn.send(msg)
            if not conn.poll(self.timeout_s):
                raise TimeoutError(f"warm child gave no answer in {self.timeout_s:.0f} s")
            kind, value = conn.recv()
        except (EOFError, OSError) as e:
            self.close()
            raise RuntimeError(f"warm child failed: {e}") from None
        if kind != "ok":
            raise RuntimeError(str(value))
        return value

    def load_scorer(self, ref: ScorerRef) -> None:
        from scheduler.solve import pickle_chunks

        if ref.gen == self.gen and self._proc is not None and self._proc.is_alive():
            return
        assert ref.source is not None
        self.gen = -1
        self.call(("scorer", ref.gen, ref.policy, pickle_chunks(ref.source.running),
                   pickle_chunks(ref.source.pending)))
        self.gen = ref.gen

    def close(self) -> None:
        conn, proc = self._conn, self._proc
        self._conn = self._proc = None
        self.gen = -1
        if conn is not None:
            conn.close()
        if proc is not None:
            proc.terminate()
            proc.join(5)


class Warmer:
    """A daemon thread filling ``memo`` for pending shapes x node signatures."""

    def __init__(self, cache: ClusterCache, memo: Memo, scorer: Callable[[], ScorerRef],
                 interval_s: float = 1.0, settle_s: float = 0.001,
                 busy: Callable[[], bool] | None = None, max_pause_s: float = 0.05,
                 in_process: bool = False) -> None:
        self.cache = cache
        self.in_process = in_process
        self.child: WarmChild | None = None
        self.busy = busy
        self.max_pause_s = max_pause_s
        self.memo = memo
        self.scorer = scorer
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.warmed = 0  # answers computed here (fits and scores)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[int, int] = (-1, -1)  # (cache version, scorer gen) last swept
        self._swept: tuple[int, frozenset[tuple[object, ...]]] | None = None  # gen, shapes
        self._shape_of: dict[str, tuple[PodRequest, tuple[object, ...], PodRequest]] = {}
        self.active: ScorerRef | None = None  # the latest scorer whose warming finished
        self.max_lag_s = 30.0
        self._latest_gen = -1
        self._latest_since = time.monotonic()
        cache.subscribe(self._wake.set)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="gpupack-warm", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.child is not None:
            self.child.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)
            if self._stop.is_set():
                return
            self._stop.wait(self.settle_s)  # let a burst of events land first
            self._wake.clear()
            try:
                self.sweep()
            except Exception:  # a warming bug must never take the extender down
                log.exception("memo warming failed")

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

    def _work(self, ref: ScorerRef) -> list[tuple[tuple[object, ...], PodRequest, int, str, bool]]:
        """(shape, selector-free pod, signature, a node in that state, fit known) to do.

        Only copies are taken under the lock, no evaluation. A full pass over every
        signature happens when the scorer or the set of pending shapes changes; else only
        the nodes whose signature changed since the last pass are looked at."""
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
        reps: dict[int, str] = {}
        for name, sig in changes:
            reps.setdefault(sig, name)
        work = []
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
        if self._thread is None or active is None or active.gen == latest.gen:
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
        try:
            work = self._work(ref)
            for i in range(0, len(work), BATCH if remote else 1):
                if self._stop.is_set():
                    return done
                done += self._batch(work[i:i + (BATCH if remote else 1)], ref, remote)
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

    def _batch(self, items: list[tuple[tuple[object, ...], PodRequest, int, str, bool]],
               ref: ScorerRef, remote: bool) -> int:
        score = not ref.name_sensitive
        if not remote:
            self.pause()
        with self.cache.lock:
            sigs = self.cache.signatures()
            nodes = self.cache.state.nodes
            todo = []
            for shape, base, sig, name, known in items:
                n = nodes.get(name)
                if n is not None and sigs.get(name) == sig:  # else: the next sweep sees it
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
