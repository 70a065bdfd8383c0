"""Whose claims a decision counts: those of the pod's own namespace.

The webhook keeps a claim for every slice or share it hands out until its cluster view
shows the pod (:mod:`webhook.claims`), so that a burst is not offered the same free
slice twice. A claim is made from an AdmissionReview, and without client-certificate
verification (:mod:`serving.client_auth`) anyone who reaches the webhook's port can post
one: 24 forged reviews for pods of a namespace ``evil`` used to take every free 3g.40gb
slice and time-sliced share of a cluster for 30 s at a time, moving other tenants' pods
to weaker isolation (a time-sliced share instead of a MIG slice) or telling them to wait.

So a decision counts the claims of its own namespace only. What another namespace's
reviews claimed leaves it exactly as it would be without them; the pods the view itself
shows pending (real pods, whatever their namespace) still count for everyone. The price:
two pods of *different* namespaces admitted within one view refresh (milliseconds to a
second) may be offered the same last free slice; the scheduler binds one, the other
waits for a slice (it is never over-committed). A burst of one workload, the case the
claims are for, is in one namespace.

:class:`ScopedViews` keeps one :class:`webhook.claims.ClaimedView` per namespace (the
most recently used :data:`NAMESPACES_KEPT`); :func:`pod_names` lists the pods a view
shows, so a claim whose name another pod already holds ends. Not thread-safe: used
under the app's decision lock.
"""

from __future__ import annotations

from collections import OrderedDict

from packing.model import Snapshot
from webhook.capacity import Claim, ClusterView
from webhook.claims import ClaimedView

# Namespaces whose claimed view is kept between reviews; a namespace past these is
# rebuilt from its claims on its next review (a few microseconds per claim).
NAMESPACES_KEPT = 256


class ScopedViews:
    """Per namespace, the base view with that namespace's live claims taken out."""

    def __init__(self, kept: int = NAMESPACES_KEPT) -> None:
        self.kept = kept
        self._views: OrderedDict[str, ClaimedView] = OrderedDict()

    def get(self, namespace: str, base: ClusterView, live: list[tuple[str, Claim]]
            ) -> ClusterView:
        """``base`` less ``live`` (the claims of ``namespace``, oldest first)."""
        claimed = self._views.get(namespace)
        if claimed is None:
            claimed = self._views[namespace] = ClaimedView()
            while len(self._views) > self.kept:
                self._views.popitem(last=False)
        else:
            self._views.move_to_end(namespace)
        return claimed.get(base, live)


def pod_names(snapshot: Snapshot) -> frozenset[str]:
    """The "namespace/name" of every pod ``snapshot`` counts (bound or pending)."""
    return frozenset([req.key for req, _ in snapshot.running]
                     + [req.key for req in snapshot.pending])


def pod_of(meta: object, namespace: str) -> str:
    """The "namespace/name" a review's pod will have, or "" when the API server is to
    generate the name (``generateName``): no other pod can hold it."""
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{namespace}/{name}" if isinstance(name, str) and name else ""
