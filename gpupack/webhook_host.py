"""The admission webhook's cluster view: the one snapshot feed over a watched cache.

Both hosts of the webhook feed it through :class:`SnapshotFeed`:

* ``gpupack serve --webhook-port`` runs the webhook app
  (:func:`webhook.app.create_webhook_app`) next to the extender in the same gunicorn
  worker process, over HTTPS from a daemon thread (:class:`serving.https.HttpsListener`),
  so its feed is over the extender's own :class:`~kube.cache.ClusterCache` (assumed binds
  included), with no second watch of the API server; a new snapshot at most once per
  ``min_interval_s`` (1 s), so a busy cluster does not keep a rebuild running all the
  time;
* ``gpupack webhook --in-cluster/--kubeconfig`` keeps a cache of its own
  (:class:`gpupack.webhook_cmd.LiveSnapshots`: the watch, the inventory expiry), fed the
  same way with no minimum interval.

Until the cache's first list is complete the feed gives no snapshot and the webhook
answers 503 (see :mod:`webhook.app`: the failurePolicy applies). The webhook's view is
rebuilt (in its own background thread, see :class:`webhook.app.ViewCache`) only when the
feed returns a new Snapshot object; the feed returns the same object until the cache
changes.
"""

from __future__ import annotations

import logging
import threading
import time

from kube.cache import ClusterCache
from packing.model import Snapshot

log = logging.getLogger("gpupack.webhook.feed")


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
