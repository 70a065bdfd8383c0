"""Background warming of the verbs' memo: answers ready before a request asks.

A memo miss is the first time a (pod shape, node state) pair is seen: the node's options
are enumerated and, for prioritize, every option is scored (the FGD gradient over the
typical shapes: up to ~15 ms for a MIG pod on an 8-GPU reconfigurable node). Every bind
puts one node into a state that may be new, so without warming the next request that
names that node pays it.

The warmer wakes on cache changes (and every ``interval_s`` to catch a new scorer), finds
the (shape, signature) pairs of pending pods' shapes that have no answer (or a score from
an older scorer) and computes them on a private copy of one node in that state. Only
copies and the final insert happen under the cache lock, so a request waits at most for
a copy of one node, never for an evaluation. The evaluation shares the GIL with the
request threads, so the warmer steps aside: before each unit of work (a fit, or the
score of one option, ~0.1-1 ms) it waits while any request is in flight (``busy``), up
to ``max_pause_s``, and works in the gaps between requests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from packing.model import PodRequest, Snapshot
from packing.state import ClusterState, GpuState, NodeState
from scheduler.cache import ClusterCache
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


def copy_node(n: NodeState) -> ClusterState:
    """A one-node ClusterState in the same state as ``n``, sharing nothing mutable."""
    gpus = [
        GpuState(g.info, g.whole_owner, dict(g.instances), dict(g.shared_owners),
                 g.reconfigurable, g.converted)
        for g in n.gpus
    ]
    state = ClusterState(Snapshot(nodes=()))
    state.nodes[n.info.name] = NodeState(n.info, n.cpu_free, n.mem_free, gpus, dict(n.pods))
    return state


class Warmer:
    """A daemon thread filling ``memo`` for pending shapes x node signatures."""

    def __init__(self, cache: ClusterCache, memo: Memo, scorer: Callable[[], ScorerRef],
                 interval_s: float = 1.0, settle_s: float = 0.005,
                 busy: Callable[[], bool] | None = None, max_pause_s: float = 0.05) -> None:
        self.cache = cache
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

    def _work(self) -> list[tuple[tuple[object, ...], PodRequest, int, str, bool]]:
        """(shape, selector-free pod, signature, a node in that state, fit known) to do.

        Only copies are taken under the lock, no evaluation. A full pass over every
        signature happens when the scorer or the set of pending shapes changes; else only
        the nodes whose signature changed since the last pass are looked at."""
        ref = self.scorer()
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
                elif ev.fits and ev.score_gen != ref.gen and not ref.name_sensitive:
                    work.append((shape, base, sig, name, True))
        return work

    def sweep(self) -> int:
        """One pass over what is missing; returns how many answers were computed."""
        done = 0
        for shape, base, sig, name, known in self._work():
            if self._stop.is_set():
                break
            ref = self.scorer()
            self.pause()
            with self.cache.lock:
                n = self.cache.state.nodes.get(name)
                if n is None or self.cache.signatures().get(name) != sig:
                    continue  # moved on; the next sweep sees its new state
                private = copy_node(n)
            ev = NodeEval(True) if known else evaluate_fit(private, base, name)
            if ev.fits and not ref.name_sensitive:
                ev.set_score(scored(private, base, name, ref.scorer, self.pause), ref.gen)
            self.pause()
            with self.cache.lock:
                self.memo.put(shape, sig, ev)
            done += 1
        self.warmed += done
        return done
