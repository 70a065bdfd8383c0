"""The admission webhook served from the extender process, over HTTPS, on the live cache.

``gpupack serve --webhook-port`` runs the webhook app (:func:`webhook.app.create_app`)
next to the extender in the same gunicorn worker process, so its snapshot provider is
the extender's own :class:`~scheduler.cache.ClusterCache` (assumed binds included), with
no second watch of the API server.

Why not :class:`webhook.server.WebhookServer`: it is a gunicorn arbiter, which must run
in a process's main thread (signal handlers) and forks its own worker; inside the
extender's worker it can run neither. Here a :class:`serving.listener.Listener` runs in
a daemon thread: its event loop does each TLS handshake (with the context of
:class:`webhook.server.ReloadingTLS`, the same per-connection certificate reload as the
standalone server, so cert-manager rotations are served without a restart) and reads
each review whole under deadlines; a few threads decide. Slow or half-open clients hold
no thread, and ``/healthz`` has a thread of its own.

Until the cache's first list is complete, :class:`SnapshotFeed` gives no snapshot and
the webhook answers 503 (see :mod:`webhook.app`: the failurePolicy applies).

The webhook's view is rebuilt (in its own background thread, see
:class:`webhook.app.ViewCache`) only when the provider returns a new Snapshot object; the
provider here returns the same object until the cache changes, and at most one new one
per ``min_interval_s``, so a busy cluster does not keep a rebuild running all the time.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

from flask import Flask

from packing.model import Snapshot
from scheduler.cache import ClusterCache
from serving.gate import Limits
from serving.listener import Listener
from webhook.app import MAX_REVIEW_BYTES
from webhook.server import ReloadingTLS

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


# The API server's own request limit: no AdmissionReview is larger (webhook.app answers
# 413 to a larger declared body; the listener refuses it before reading it).
WEBHOOK_LIMITS = Limits(max_body=MAX_REVIEW_BYTES, idle_s=75.0)


class WebhookHost:
    """The webhook's HTTPS listener in a daemon thread of this process."""

    def __init__(self, app: Flask, host: str, port: int, cert: Path, key: Path,
                 threads: int = 4, limits: Limits = WEBHOOK_LIMITS) -> None:
        self.tls = ReloadingTLS(cert, key)
        self.listener = Listener(app, host, port, limits=limits, threads=threads,
                                 tls=self.tls.context, name="gpupack-webhook")

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> None:
        self.listener.start()
        log.info("admission webhook on https://%s:%d/mutate", *self.address())

    def address(self) -> tuple[str, int]:
        return self.listener.address()

    def stop(self) -> None:
        self.listener.stop()


def check_tls(cert: Path, key: Path) -> str | None:
    """Why the pair cannot serve, or None (checked before the server starts)."""
    try:
        ReloadingTLS(cert, key).context()
    except OSError as e:  # ssl.SSLError included
        return str(e)
    return None


def bind_error(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on now (None: it can). Checked before gunicorn
    starts: a listener that fails inside the worker would make gunicorn restart the
    worker for ever."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return f"cannot listen on {host}:{port}: {e.strerror or e}"
    return None
