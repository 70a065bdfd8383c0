"""HTTPS serving of a WSGI app, with certificate rotation: the two ways the webhook is run.

:class:`HttpsServer` (``gpupack webhook``) is gunicorn in this process: one threaded
worker (:class:`serving.gunicorn_worker.GatedThreadWorker`: threads see only whole
requests, read by the main loop under deadlines, TLS handshake included) asking its
``ssl_context`` hook for a context on every new connection.

:class:`HttpsListener` (``gpupack serve --webhook-port``) runs beside another server in
one process. A gunicorn arbiter cannot: it must run in a process's main thread (signal
handlers) and forks its own worker. Here a :class:`serving.listener.Listener` runs in a
daemon thread: its event loop does each TLS handshake and reads each request whole
under deadlines; a few threads answer. Slow or half-open clients hold no thread, and
``/healthz`` has a thread of its own.

Both take each connection's context from :class:`serving.tls.ReloadingTLS`, so a
certificate rotated by cert-manager is served from the next connection on, with no
restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication

from serving.client_auth import ClientAuth
from serving.gate import Limits
from serving.gunicorn_worker import GatedThreadWorker
from serving.listener import Listener
from serving.tls import ReloadingTLS
from serving.wsgi import WSGIApp

log = logging.getLogger("gpupack.serving")


class HttpsServer(BaseApplication):
    """gunicorn in this process: a threaded worker serving the app over TLS; ``run()``
    serves until signalled (gunicorn handles SIGTERM/SIGINT)."""

    def __init__(
        self,
        app_factory: Callable[[], Flask],
        *,
        host: str,
        port: int,
        cert: Path,
        key: Path,
        limits: Limits,
        name: str,
        threads: int = 8,
        log_level: str = "info",
        client_auth: ClientAuth | None = None,
    ) -> None:
        self.app_factory = app_factory
        self.settings: dict[str, Any] = {
            "bind": f"{host}:{port}",
            # One process: the cluster view is cached in memory; threads give the
            # concurrency the API server needs (reviews are short and CPU-light).
            "workers": 1,
            # gthread whose threads see only whole requests, read by the main loop under
            # deadlines (TLS handshake included): no client can stall the server. A
            # body over limits.max_body is handed on unread: the app answers (413).
            "worker_class": GatedThreadWorker.configured(limits, oversize="dispatch"),
            "threads": threads,
            "preload_app": False,
            "timeout": 30,
            "graceful_timeout": 10,
            "keepalive": 75,  # the API server reuses webhook connections
            "accesslog": None,
            "loglevel": log_level.lower(),
            "proc_name": name,
            # gunicorn wants the files to know TLS is on; the hook does the loading.
            "certfile": str(cert),
            "keyfile": str(key),
            "ssl_context": ReloadingTLS(cert, key, client_auth).gunicorn_hook(),
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


class HttpsListener:
    """``app``'s HTTPS listener in a daemon thread of this process (``what`` and ``path``
    name it in the log line that says where it listens)."""

    def __init__(self, app: WSGIApp, host: str, port: int, cert: Path, key: Path, *,
                 limits: Limits, name: str, threads: int = 4, what: str = "HTTPS",
                 path: str = "", client_auth: ClientAuth | None = None) -> None:
        self.tls = ReloadingTLS(cert, key, client_auth)
        self.listener = Listener(app, host, port, limits=limits, threads=threads,
                                 tls=self.tls.context, name=name)
        self.what, self.path = what, path

    @property
    def port(self) -> int:
        return self.listener.port

    def start(self) -> None:
        self.listener.start()
        log.info("%s on https://%s:%d%s", self.what, *self.address(), self.path)

    def address(self) -> tuple[str, int]:
        return self.listener.address()

    def stop(self) -> None:
        self.listener.stop()
