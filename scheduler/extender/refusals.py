"""Recent refusals, and the node changes that may have made them stale.

kube-scheduler retries a parked pod on a Node event (new allocatable, a label), often
before gpupack's watch has shown that event: the filter then refuses the pod on the
node's older state, and kube-scheduler parks it again with no event left to come. So
each full refusal (no candidate kept) is remembered for ``window_s`` with its candidate
nodes; when the cache then takes a change of one of those nodes (a Node object, not a
heartbeat), the refusal was made on a view that is now older, and the pod is woken with
a status condition (:func:`kube.pod_conditions.node_changed`), which requeues it.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from kube.pod_conditions import node_changed
from kube.record_writer import Submitter

DEFAULT_WINDOW_S = 10.0
# Candidates a refusal keeps that the cache does not know, at most. A node the watch has
# not shown yet matters (its ADDED then wakes the pod), and the watch lags by a few
# events; a request naming many more is not kept whole (up to ``limit`` refusals of a
# request body's every name each: gigabytes).
UNKNOWN_KEPT = 100


def remembered(candidates: Iterable[str], known: Callable[[str], bool],
               unknown_kept: int = UNKNOWN_KEPT) -> list[str]:
    """The candidates a refusal is remembered with: every one ``known`` says the cache
    has, and the first ``unknown_kept`` others (so its size is bounded by the cluster's,
    not by the request's)."""
    out: list[str] = []
    unknown = 0
    for name in candidates:
        if known(name):
            out.append(name)
        elif unknown < unknown_kept:
            unknown += 1
            out.append(name)
    return out


class RecentRefusals:
    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 window_s: float = DEFAULT_WINDOW_S, limit: int = 256) -> None:
        self.clock = clock
        self.window_s = window_s
        # (when, pod, its candidates): a set, since stale() runs under the cache lock on
        # every node change and asks each refusal about one node.
        self._seen: deque[tuple[float, str, frozenset[str]]] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def refused(self, key: str, candidates: Iterable[str]) -> None:
        """Pod ``key`` was refused on every one of ``candidates``."""
        with self._lock:
            self._seen.append((self.clock(), key, frozenset(candidates)))

    def stale(self, node: str) -> list[str]:
        """The pods refused within the window with ``node`` among their candidates (each
        once: they are forgotten)."""
        now = self.clock()
        with self._lock:
            keep: deque[tuple[float, str, frozenset[str]]] = deque(maxlen=self._seen.maxlen)
            out: list[str] = []
            for t, key, nodes in self._seen:
                if now - t >= self.window_s:
                    continue
                if node in nodes:
                    if key not in out:
                        out.append(key)
                else:
                    keep.append((t, key, nodes))
            self._seen = keep
        return out

    def waker(self, requeue: Submitter) -> Callable[[str], None]:
        """The hook for :meth:`kube.cache.ClusterCache.on_node_changed`: queue the status
        patch of each pod :meth:`stale` names for the node (non-blocking: it runs under
        the cache lock)."""

        def wake(node: str) -> None:
            now = dt.datetime.now(dt.UTC)
            for key in self.stale(node):
                requeue.submit(key, node_changed(key, node, now))

        return wake
