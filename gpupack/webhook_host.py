"""The admission webhook's cluster view when the extender process serves it: the live cache.

``gpupack serve --webhook-port`` runs the webhook app (:func:`webhook.app.create_extender_app`)
next to the extender in the same gunicorn worker process, over HTTPS from a daemon
thread (:class:`serving.https.HttpsListener`), so its snapshot provider is the
extender's own :class:`~kube.cache.ClusterCache` (assumed binds included), with no
second watch of the API server.

Until the cache's first list is complete, :class:`SnapshotFeed` gives no snapshot and
the webhook answers 503 (see :mod:`webhook.app`: the failurePolicy applies).

The webhook's view is rebuilt (in its own background thread, see
:class:`webhook.app.ViewCache`) only when the provider returns a new Snapshot object; the
provider here returns the same object until the cache changes, and at most one new one
per ``min_interval_s``, so a busy cluster does not keep a rebuild running all the time.
"""

from __future__ import annotations

import logging
import threading
import time

from kube.cache import ClusterCache
from packing.model import Snapshot

log = logging.getLogger("gpupack.scheduler.webhook")


class SnapshotFeed:
    """A snapshot provider on the cache: the same object while nothing changed."""

    def __init__(self, cache: ClusterCache, min_interval_s: float = 1.0) -> None:
        self.cache = cache
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._version = -1
        self._at = 0.0
        self._snapshot: Snapshot | None = None

    def ready(self) -> bool:
        return bool(self.cache.synced)

    def __call__(self) -> Snapshot | None:
        if not self.cache.synced:
            return None  # no complete list yet: the webhook decides nothing
        with self._lock:
            now = time.monotonic()
            current = self.cache.version
            if self._snapshot is None or (
                current != self._version and now - self._at >= self.min_interval_s
            ):
                self._snapshot = self.cache.snapshot()
                self._version, self._at = current, now
            return self._snapshot
