"""TLS for the project's HTTPS servers: a serving context reloaded when its files change.

The API server only talks HTTPS to webhooks, and cert-manager rotates the serving
certificate by rewriting the Secret's files in place. Both HTTPS servers (gunicorn's
``ssl_context`` hook in :mod:`serving.https`, and :class:`serving.listener.Listener`'s
``tls`` callable) ask for a context on every new connection; :class:`ReloadingTLS`
returns a cached context and rebuilds it when the files' stat signature (mtime, size,
inode) changes, so a rotated certificate is served from the next connection on, with no
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

from serving.client_auth import ClientAuth

log = logging.getLogger("gpupack.webhook.tls")

_Signature = tuple[int, ...]


class ReloadingTLS:
    """A server SSLContext for a cert/key file pair, reloaded when the files change.
    With ``client_auth`` (:mod:`serving.client_auth`), the context also asks clients for
    a certificate and verifies one against its CA file, reloaded with the pair."""

    def __init__(self, cert: Path, key: Path, client_auth: ClientAuth | None = None) -> None:
        self.cert = Path(cert)
        self.key = Path(key)
        self.client_auth = client_auth
        self._lock = threading.Lock()
        self._signature: _Signature | None = None
        self._context: ssl.SSLContext | None = None
        self.loads = 0  # successful (re)loads, for logs and tests

    def _stat(self) -> _Signature:
        # os.stat follows the ..data symlinks of a Kubernetes Secret volume, so an
        # atomic swap of the directory shows up as a new inode and mtime.
        files = [self.cert, self.key]
        if self.client_auth is not None:
            files.append(self.client_auth.ca)
        return tuple(v for f in files for s in (os.stat(f),)
                     for v in (s.st_mtime_ns, s.st_size, s.st_ino))

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(certfile=str(self.cert), keyfile=str(self.key))
        if self.client_auth is not None:
            self.client_auth.configure(ctx)
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


def check_tls(cert: Path, key: Path) -> str | None:
    """Why the pair cannot serve, or None (checked before a server starts)."""
    try:
        ReloadingTLS(cert, key).context()
    except OSError as e:  # ssl.SSLError included
        return str(e)
    return None
