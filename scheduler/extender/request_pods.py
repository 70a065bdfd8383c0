"""Pods known only from a filter or prioritize request, remembered until their bind.

kube-scheduler sends the whole Pod in filter and prioritize, but only its name, namespace
and UID in bind. When the cache has not listed the pod (static mode, where the files
hold only the cluster as it was; the informer lagging behind the API server in API
mode), the bind would otherwise have nothing to place. The request's Pod is kept here,
bounded in count (least recently seen first out) and in time (``ttl_s`` after it was
last seen), and taken out by the bind that uses it.

The clock is injected (monotonic seconds) so tests control the expiry.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from packing.model import PodRequest

DEFAULT_LIMIT = 2048
DEFAULT_TTL_S = 300.0


@dataclass(frozen=True)
class RequestPod:
    """A pod as a request showed it: its object and what gpupack read of it."""

    obj: Mapping[str, Any]
    req: PodRequest
    seen: float


class RequestPods:
    """Bounded memory of request-only pods, by pod key (thread-safe)."""

    def __init__(self, limit: int = DEFAULT_LIMIT, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or ttl_s <= 0:
            raise ValueError(f"RequestPods: limit {limit} and ttl_s {ttl_s} must be positive")
        self.limit = limit
        self.ttl_s = ttl_s
        self.clock = clock
        self._items: OrderedDict[str, RequestPod] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def remember(self, obj: Mapping[str, Any], req: PodRequest) -> None:
        now = self.clock()
        with self._lock:
            self._items.pop(req.key, None)
            self._items[req.key] = RequestPod(obj, req, now)
            self._trim(now)

    def take(self, key: str, uid: str) -> RequestPod | None:
        """The pod remembered under ``key`` (and forgotten), if it is still fresh and its
        UID is ``uid`` (an empty ``uid`` matches any)."""
        now = self.clock()
        with self._lock:
            self._trim(now)
            got = self._items.get(key)
            if got is None or (uid and got.req.uid and got.req.uid != uid):
                return None
            del self._items[key]
            return got

    def put_back(self, item: RequestPod) -> None:
        """A bind that failed: the pod may be bound again later (kube-scheduler retries)."""
        self.remember(item.obj, item.req)

    def _trim(self, now: float) -> None:
        while self._items:
            key, oldest = next(iter(self._items.items()))
            if len(self._items) > self.limit or now - oldest.seen >= self.ttl_s:
                del self._items[key]
            else:
                break
