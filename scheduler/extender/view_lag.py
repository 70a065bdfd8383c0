"""How long the extender answers "my view is behind kube-scheduler's; try again".

kube-scheduler's informer can be ahead of gpupack's watch by a pod or a node. An extender
error makes kube-scheduler retry the pod after its backoff, where a refusal would park
it until some later cluster event (scheduler/extender/verbs.py, scheduler/groups/plugin.py). But an
error is no verdict: kube-scheduler runs no preemption for it, and the pod's
``PodScheduled`` reason stays ``SchedulerError`` (cluster-autoscaler only acts on
``Unschedulable``). So the error is given for a grace only, per thing found behind:
what gpupack has still not caught up with after ``grace_s`` (an event the watch
dropped, a watch that stalled, a view that will never agree) is refused as before.

Keys name the thing *and the version of gpupack's view of it* (a node's signature, a
pod's uid), so a later lag of the same node starts a grace of its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

DEFAULT_GRACE_S = 30.0


class ViewLag:
    """First time each key was found behind; ``behind`` says whether it still may be."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 grace_s: float = DEFAULT_GRACE_S, limit: int = 10_000,
                 answered: Counter | None = None) -> None:
        """``answered``: counts the error answers, by ``what`` (label values "node",
        "pod"); ``limit``: keys kept at most (older ones are forgotten first)."""
        self.clock = clock
        self.grace_s = grace_s
        self.limit = limit
        self.answered = answered
        self._first: dict[str, float] = {}
        self._lock = threading.Lock()

    def behind(self, key: str, what: str) -> bool:
        """Whether ``key`` may still be answered with an error: it was first found behind
        less than ``grace_s`` ago (now, when this is the first time)."""
        now = self.clock()
        with self._lock:
            first = self._first.get(key)
            if first is None:
                if len(self._first) >= self.limit:
                    self._forget(now)
                self._first[key] = first = now
        fresh = now - first < self.grace_s
        if fresh and self.answered is not None:
            self.answered.labels(what).inc()
        return fresh

    def _forget(self, now: float) -> None:
        """Drop keys past twice the grace (a key dropped while still behind only gets
        another grace); if that is not enough, the older half."""
        self._first = {k: t for k, t in self._first.items() if now - t < 2 * self.grace_s}
        if len(self._first) >= self.limit:
            keep = sorted(self._first.items(), key=lambda kv: kv[1])[len(self._first) // 2:]
            self._first = dict(keep)
