"""Background warming of the verbs' memo: answers ready before a request asks.

A memo miss is the first time a (pod shape, node state) pair is seen: the node's options
are enumerated and, for prioritize, every option is scored (the FGD gradient over the
typical shapes: up to ~15 ms for a MIG pod on an 8-GPU reconfigurable node). Every bind
puts one node into a state that may be new, so without warming the next request that
names that node pays it.

The warmer wakes on cache changes (and every ``interval_s`` to catch a new scorer), finds
the (shape, signature) pairs of pending pods' shapes that have no answer (or a score from
an older scorer) and computes them on a private copy of one node in that state. Only the
copy and the final insert happen under the cache lock, so a request waits at most for
a copy of one node, never for an evaluation; the evaluation itself shares the GIL with
the request threads (the switch interval is short, see ``gpupack serve``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from packing.model import PodRequest, Snapshot
from packing.state import ClusterState, GpuState, NodeState
from scheduler.cache import ClusterCache
from scheduler.verbs import (
    Memo,
    NodeEval,
    ScorerRef,
    best_key,
    evaluate_fit,
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
                 interval_s: float = 1.0, settle_s: float = 0.005) -> None:
        self.cache = cache
        self.memo = memo
        self.scorer = scorer
        self.interval_s = interval_s
        self.settle_s = settle_s
        self.warmed = 0  # answers computed here (fits and scores)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: tuple[int, int] = (-1, -1)  # (cache version, scorer gen) last swept
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

    def _work(self) -> list[tuple[tuple[object, ...], PodRequest, int, str, bool]]:
        """(shape, selector-free pod, signature, a node in that state, fit known) to do.

        Taken under the lock; O(nodes + pending) dict work, no evaluation."""
        ref = self.scorer()
        with self.cache.lock:
            if not self.cache.synced:
                return []
            mark = (self.cache.version, ref.gen)
            if mark == self._seen:
                return []
            self._seen = mark
            shapes: dict[tuple[object, ...], PodRequest] = {}
            for pod in self.cache.pending():
                base = selector_free(pod)
                shapes.setdefault(shape_key(base), base)
                if len(shapes) >= MAX_SHAPES:
                    break
            reps: dict[int, str] = {}
            for name, sig in self.cache.signatures().items():
                reps.setdefault(sig, name)
            work = []
            for shape, base in shapes.items():
                table = self.memo.tables.get(shape, {})
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
            with self.cache.lock:
                n = self.cache.state.nodes.get(name)
                if n is None or self.cache.signatures().get(name) != sig:
                    continue  # moved on; the next sweep sees its new state
                private = copy_node(n)
            ev = NodeEval(True) if known else evaluate_fit(private, base, name)
            if ev.fits and not ref.name_sensitive:
                ev.best = best_key(private, base, name, ref.scorer)
                ev.score_gen = ref.gen
            with self.cache.lock:
                self.memo.put(shape, sig, ev)
            done += 1
        self.warmed += done
        return done
