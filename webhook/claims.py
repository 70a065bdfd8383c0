"""Slices and shares the webhook has handed out that its cluster view cannot see yet.

The webhook decides from a view of the cluster (:class:`webhook.capacity.ClusterView`)
that lags the API server: a pod it converts now reaches the view only after the watch
delivers it and the view is rebuilt. Without a record, a burst of pods created within
that lag is offered the same free slice again and again (three 30Gi pods against one
free 3g.40gb slice all became MIG pods while eight L40S shares were free).

:class:`ClaimBook` keeps what each admission took, keyed by the admission's id (the
AdmissionReview uid, which the webhook writes into the pod's ``gpupack.io/decision``).
A claim ends when a view counts the pod (the id appears in ``ClusterView.seen``: pending,
where :meth:`ClusterView.of` counts it as a claim of its own, or bound), or after
``ttl_s`` when no view ever shows it (the create failed after admission, or the pod was
deleted before the watch delivered it). At most ``max_claims`` are held; beyond that the
oldest goes first, so memory is bounded whatever the API server sends.

A claim carries the nodes its pod could reach (:attr:`Claim.reach`): a claim of a pod
restricted to pool A is taken from the views of pool A and of the whole cluster, never
from a view of pool B (:meth:`ClusterView.with_claims`).

Thread-safe; the clock is injected.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Set
from typing import Any

from webhook.capacity import Claim, ClusterView

DEFAULT_TTL_S = 30.0
DEFAULT_MAX_CLAIMS = 4096


class ClaimBook:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_claims: int = DEFAULT_MAX_CLAIMS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0 or max_claims <= 0:
            raise ValueError(f"ttl_s ({ttl_s}) and max_claims ({max_claims}) must be positive")
        self.ttl_s = ttl_s
        self.max_claims = max_claims
        self._clock = clock
        self._lock = threading.Lock()
        self._claims: OrderedDict[str, tuple[float, Claim, Any]] = OrderedDict()

    def add(self, admission_id: str, claim: Claim, answer: Any = None) -> None:
        """Record what admission ``admission_id`` took (a repeat replaces the first);
        ``answer``: what the webhook answered it, given back by :meth:`answer` while the
        claim lives (the API server retries a call with the same review uid)."""
        if not admission_id:
            return
        with self._lock:
            self._claims.pop(admission_id, None)
            self._claims[admission_id] = (self._clock(), claim, answer)
            while len(self._claims) > self.max_claims:
                self._claims.popitem(last=False)

    def answer(self, admission_id: str) -> Any:
        """The answer recorded with ``admission_id``'s claim (None: no claim held, or
        none recorded). Call after :meth:`live_items`, which drops the ended claims."""
        with self._lock:
            held = self._claims.get(admission_id)
            return None if held is None else held[2]

    def live(self, seen: Set[str]) -> list[Claim]:
        """The claims a view with ``seen`` does not count yet, oldest first; drops the
        ones it counts and the expired ones."""
        return [c for _, c in self.live_items(seen)]

    def live_items(self, seen: Set[str]) -> list[tuple[str, Claim]]:
        """:meth:`live` with each claim's admission id."""
        now = self._clock()
        with self._lock:
            for key in [k for k, (at, _, _) in self._claims.items()
                        if k in seen or now - at >= self.ttl_s]:
                del self._claims[key]
            return [(k, c) for k, (_, c, _) in self._claims.items()]

    def __len__(self) -> int:
        with self._lock:
            return len(self._claims)


class ClaimedView:
    """A view with the live claims taken out, kept between reviews: while the view is the
    same object and claims were only added since, only the new ones are applied (a burst
    inside one view refresh would otherwise re-apply every earlier claim per review).
    A claim is known by its id and its object: one replaced under the same id (a later
    review reusing an id) rebuilds the view, never keeps the old deduction.
    Not thread-safe: used under the app's decision lock."""

    def __init__(self) -> None:
        self._base: ClusterView | None = None
        self._applied: list[tuple[str, Claim]] = []
        self._view: ClusterView | None = None

    def get(self, base: ClusterView, live: list[tuple[str, Claim]]) -> ClusterView:
        n = len(self._applied)
        if (self._view is None or base is not self._base or len(live) < n
                or any(k != k2 or c is not c2
                       for (k, c), (k2, c2) in zip(live, self._applied, strict=False))):
            self._base, self._applied, self._view = base, [], base
            n = 0
        assert self._view is not None
        if len(live) > n:
            self._view = self._view.with_claims(c for _, c in live[n:])
            self._applied = list(live)
        return self._view
