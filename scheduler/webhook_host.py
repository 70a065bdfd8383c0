"""The admission webhook served from the extender process, over HTTPS, on the live cache.

``gpupack serve --webhook-port`` runs the webhook app (:func:`webhook.app.create_app`)
next to the extender in the same gunicorn worker process, so its snapshot provider is
the extender's own :class:`~scheduler.cache.ClusterCache` (assumed binds included), with
no second watch of the API server.

Why not :class:`webhook.server.WebhookServer`: it is a gunicorn arbiter, which must run
in a process's main thread (signal handlers) and forks its own worker; inside the
extender's worker it can run neither. Here a threaded WSGI server (werkzeug's, HTTP/1.1
keep-alive, one thread per connection) runs in a daemon thread, and each accepted
connection is wrapped with the context of :class:`webhook.server.ReloadingTLS`: the same
per-connection certificate reload as the standalone server, so cert-manager rotations
are served without a restart. The TLS handshake happens in the connection's thread, so
a slow client never holds up the accept loop.

The webhook's view is rebuilt (in its own background thread, see
:class:`webhook.app.ViewCache`) only when the provider returns a new Snapshot object; the
provider here returns the same object until the cache changes, and at most one new one
per ``min_interval_s``, so a busy cluster does not keep a rebuild running all the time.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from flask import Flask
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

from packing.model import Snapshot
from scheduler.cache import ClusterCache
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

    def __call__(self) -> Snapshot:
        with self._lock:
            now = time.monotonic()
            current = self.cache.version
            if self._snapshot is None or (
                current != self._version and now - self._at >= self.min_interval_s
            ):
                self._snapshot = self.cache.snapshot()
                self._version, self._at = current, now
            return self._snapshot


class _Handler(WSGIRequestHandler):
    timeout = 75  # idle keep-alive connections are closed after this (seconds)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        del code, size  # the webhook app counts and times every review itself


class TLSServer(ThreadedWSGIServer):
    """werkzeug's threaded server with a TLS context chosen per accepted connection."""

    daemon_threads = True

    def __init__(self, host: str, port: int, app: Flask, tls: ReloadingTLS) -> None:
        super().__init__(host, port, app, handler=_Handler)
        self.tls = tls
        # Marks the server as HTTPS for the handler (url scheme, TLS error logging).
        self.ssl_context = tls.context()

    def get_request(self) -> tuple[Any, Any]:
        sock, addr = self.socket.accept()
        try:
            ctx = self.tls.context()
            return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr
        except (OSError, ssl.SSLError):
            sock.close()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("webhook connection from %s failed", client_address, exc_info=True)


class WebhookHost:
    """The webhook's HTTPS server in a daemon thread of this process."""

    def __init__(self, app: Flask, host: str, port: int, cert: Path, key: Path) -> None:
        self.server = TLSServer(host, port, app, ReloadingTLS(cert, key))
        self.thread = threading.Thread(target=self.server.serve_forever, name="gpupack-webhook",
                                       daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.socket.getsockname()[1])

    def start(self) -> None:
        self.thread.start()
        log.info("admission webhook on https://%s:%d/mutate", *self.address())

    def address(self) -> tuple[str, int]:
        name = self.server.socket.getsockname()
        return (str(name[0]), int(name[1]))

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


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
