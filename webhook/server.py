"""HTTPS serving of the webhook app under gunicorn, with certificate rotation.

The API server only talks HTTPS to webhooks, and cert-manager rotates the serving
certificate by rewriting the Secret's files in place. gunicorn's threaded worker asks
its ``ssl_context`` hook for a context on every new connection; the hook here returns a
cached context and rebuilds it when the files' stat signature (mtime, size, inode)
changes, so a rotated certificate is served from the next connection on, with no
restart. A half-written pair (new cert, old key) fails to load: the previous context is
kept and the load is retried on the next connection.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from serving.gate import Limits
from serving.gunicorn_worker import GatedThreadWorker
from webhook.app import MAX_REVIEW_BYTES

log = logging.getLogger("gpupack.webhook.tls")

_Signature = tuple[int, int, int, int, int, int]


class ReloadingTLS:
    """A server SSLContext for a cert/key file pair, reloaded when the files change."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert = Path(cert)
        self.key = Path(key)
        self._lock = threading.Lock()
        self._signature: _Signature | None = None
        self._context: ssl.SSLContext | None = None
        self.loads = 0  # successful (re)loads, for logs and tests

    def _stat(self) -> _Signature:
        # os.stat follows the ..data symlinks of a Kubernetes Secret volume, so an
        # atomic swap of the directory shows up as a new inode and mtime.
        c, k = os.stat(self.cert), os.stat(self.key)
        return (c.st_mtime_ns, c.st_size, c.st_ino, k.st_mtime_ns, k.st_size, k.st_ino)

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(certfile=str(self.cert), keyfile=str(self.key))
        return ctx

    def context(self) -> ssl.SSLContext:
        """The current context; raises only if no pair could ever be loaded."""
        with self._lock:
            try:
                signature = self._stat()
            except OSError as e:
                if self._context is None:
                    raise
                log.warning("TLS files unreadable (%s); keeping the loaded certificate", e)
                return self._context
            if signature != self._signature or self._context is None:
                try:
                    self._context = self._build()
                    self._signature = signature
                    self.loads += 1
                    log.info("loaded TLS certificate %s (load %d)", self.cert, self.loads)
                except (ssl.SSLError, OSError) as e:
                    if self._context is None:
                        raise
                    # Mid-rotation: the files do not match yet. Retry next connection.
                    log.warning("TLS reload failed (%s); keeping the previous certificate", e)
            return self._context

    def gunicorn_hook(self) -> Callable[[Any, Callable[[], ssl.SSLContext]], ssl.SSLContext]:
        """gunicorn's ``ssl_context(config, default_factory)`` server hook."""

        def ssl_context(config: Any, default_factory: Callable[[], ssl.SSLContext]
                        ) -> ssl.SSLContext:
            del config, default_factory  # the files are ours to watch, not gunicorn's
            return self.context()

        return ssl_context


class WebhookServer(BaseApplication):
    """gunicorn in this process: a threaded worker serving the app over TLS."""

    def __init__(
        self,
        app_factory: Callable[[], Flask],
        *,
        host: str,
        port: int,
        cert: Path,
        key: Path,
        threads: int = 8,
        log_level: str = "info",
    ) -> None:
        self.app_factory = app_factory
        self.settings: dict[str, Any] = {
            "bind": f"{host}:{port}",
            # One process: the cluster view is cached in memory; threads give the
            # concurrency the API server needs (reviews are short and CPU-light).
            "workers": 1,
            # gthread whose threads see only whole requests, read by the main loop under
            # deadlines (TLS handshake included): no client can stall the webhook. A
            # body over the API server's own limit is handed on unread: 413.
            "worker_class": GatedThreadWorker.configured(
                Limits(max_body=MAX_REVIEW_BYTES, idle_s=75.0), oversize="dispatch"),
            "threads": threads,
            "preload_app": False,
            "timeout": 30,
            "graceful_timeout": 10,
            "keepalive": 75,  # the API server reuses webhook connections
            "accesslog": None,
            "loglevel": log_level.lower(),
            "proc_name": "gpupack-webhook",
            # gunicorn wants the files to know TLS is on; the hook does the loading.
            "certfile": str(cert),
            "keyfile": str(key),
            "ssl_context": ReloadingTLS(cert, key).gunicorn_hook(),
            # Several servers (tests, the extender) may run side by side; the runtime
            # control socket has one default path and is not needed here.
            "control_socket_disable": True,
        }
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.settings.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Flask:
        return self.app_factory()


def serve(
    app_factory: Callable[[], Flask],
    *,
    host: str,
    port: int,
    cert: Path,
    key: Path,
    threads: int = 8,
    log_level: str = "info",
) -> None:
    """Run until signalled (gunicorn handles SIGTERM/SIGINT)."""
    WebhookServer(app_factory, host=host, port=port, cert=cert, key=key, threads=threads,
                  log_level=log_level).run()
