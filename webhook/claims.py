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

A claim is also kept in the namespace its review named, and counts only for decisions
about pods of that namespace (:mod:`webhook.claim_scope`): reviews are not authenticated
unless the webhook verifies the API server's client certificate, so anyone who can reach
the port could post them, and a claim must never take a slice from another tenant. Per
namespace at most ``max_per_namespace`` claims are held (the oldest goes first), and
when the whole book is full the oldest claim of the namespace holding the most goes, so
one namespace's flood cannot push out another's claims. A claim also ends when the view
shows another pod under the name it was made for: that create fails (AlreadyExists),
its pod can no longer appear.

Thread-safe; the clock is injected.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Set
from typing import Any

from webhook.capacity import Claim, ClusterView

DEFAULT_TTL_S = 30.0
DEFAULT_MAX_CLAIMS = 4096
DEFAULT_MAX_PER_NAMESPACE = 512

# (made at, claim, answer, the pod's "namespace/name" or "" when the review named none)
_Held = tuple[float, Claim, Any, str]


class ClaimBook:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_claims: int = DEFAULT_MAX_CLAIMS,
                 clock: Callable[[], float] = time.monotonic,
                 max_per_namespace: int = DEFAULT_MAX_PER_NAMESPACE) -> None:
        if ttl_s <= 0 or max_claims <= 0 or max_per_namespace <= 0:
            raise ValueError(f"ttl_s ({ttl_s}), max_claims ({max_claims}) and "
                             f"max_per_namespace ({max_per_namespace}) must be positive")
        self.ttl_s = ttl_s
        self.max_claims = max_claims
        self.max_per_namespace = max_per_namespace
        self._clock = clock
        self._lock = threading.Lock()
        # namespace -> admission id -> what it holds, oldest first.
        self._claims: dict[str, OrderedDict[str, _Held]] = {}
        self._count = 0
        self.pushed_out = 0  # claims dropped for a bound (per namespace or in all)

    def add(self, admission_id: str, claim: Claim, answer: Any = None, *,
            namespace: str = "", pod: str = "") -> None:
        """Record what admission ``admission_id`` of ``namespace`` took (a repeat
        replaces the first); ``answer``: what the webhook answered it, given back by
        :meth:`answer` while the claim lives (the API server retries a call with the same
        review uid); ``pod``: the pod's "namespace/name" ("" for a generated name)."""
        if not admission_id:
            return
        with self._lock:
            book = self._claims.setdefault(namespace, OrderedDict())
            if book.pop(admission_id, None) is not None:
                self._count -= 1
            book[admission_id] = (self._clock(), claim, answer, pod)
            self._count += 1
            while len(book) > self.max_per_namespace:
                self._pop_oldest(namespace)
            while self._count > self.max_claims:
                # The namespace holding the most gives up its oldest.
                self._pop_oldest(max(self._claims, key=lambda n: (len(self._claims[n]), n)))

    def _pop_oldest(self, namespace: str) -> None:
        book = self._claims[namespace]
        book.popitem(last=False)
        self._count -= 1
        self.pushed_out += 1
        if not book:
            del self._claims[namespace]

    def answer(self, admission_id: str, namespace: str = "") -> Any:
        """The answer recorded with ``admission_id``'s claim in ``namespace`` (None: no
        claim held, or none recorded). Call after :meth:`live_items`, which drops the
        ended claims."""
        with self._lock:
            book = self._claims.get(namespace)
            held = None if book is None else book.get(admission_id)
            return None if held is None else held[2]

    def live(self, seen: Set[str], namespace: str | None = None) -> list[Claim]:
        """The claims a view with ``seen`` does not count yet, oldest first; drops the
        ones it counts and the expired ones."""
        return [c for _, c in self.live_items(seen, namespace)]

    def live_items(self, seen: Set[str], namespace: str | None = None,
                   names: Container[str] = frozenset()) -> list[tuple[str, Claim]]:
        """:meth:`live` with each claim's admission id: those of ``namespace`` (None:
        every namespace's, namespace by namespace). Every claim the view counts
        (``seen``), that expired, or whose pod's name the view shows taken by another
        pod (``names``: "namespace/name" of the view's pods) is dropped first."""
        now = self._clock()
        with self._lock:
            for ns in list(self._claims):
                book = self._claims[ns]
                for key in [k for k, (at, _, _, pod) in book.items()
                            if k in seen or now - at >= self.ttl_s or (pod and pod in names)]:
                    del book[key]
                    self._count -= 1
                if not book:
                    del self._claims[ns]
            spaces = list(self._claims) if namespace is None else [namespace]
            return [(k, held[1]) for ns in spaces if ns in self._claims
                    for k, held in self._claims[ns].items()]

    def __len__(self) -> int:
        with self._lock:
            return self._count


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
