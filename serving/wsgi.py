"""A complete request in, a WSGI call, the response bytes out (no sockets here).

The request threads of :class:`serving.listener.Listener` run this: the event loop has
already read the whole request, so the application's ``wsgi.input`` is an in-memory
stream and nothing here can wait on a client.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import unquote_to_bytes

from serving.client_auth import PEER_CERT
from serving.head import Head

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def environ(head: Head, body: bytes, *, server: tuple[str, int], client: tuple[str, int],
            scheme: str, peer_cert: dict[str, Any] | None = None) -> dict[str, Any]:
    """``peer_cert``: the client certificate verified in the TLS handshake
    (:mod:`serving.client_auth`), under :data:`serving.client_auth.PEER_CERT`."""
    path, _, query = head.target.partition("?")
    env: dict[str, Any] = {
        "REQUEST_METHOD": head.method,
        "SCRIPT_NAME": "",
        # PEP 3333: the path decoded to bytes, carried as latin-1 text.
        "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
        "QUERY_STRING": query,
        "SERVER_NAME": server[0],
        "SERVER_PORT": str(server[1]),
        "SERVER_PROTOCOL": head.version,
        "REMOTE_ADDR": client[0],
        "REMOTE_PORT": str(client[1]),
        "CONTENT_LENGTH": str(len(body)) if body or head.method in ("POST", "PUT") else "",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scheme,
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
        PEER_CERT: peer_cert,
    }
    for name, value in head.headers:
        if name == "content-type":
            env["CONTENT_TYPE"] = value
            continue
        if name in ("content-length", "transfer-encoding"):
            continue  # the body is given whole: its length is CONTENT_LENGTH above
        key = "HTTP_" + name.upper().replace("-", "_")
        env[key] = f"{env[key]},{value}" if key in env else value
    return env


def call(app: WSGIApp, env: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """Run the application; (status line, headers, body). Raises what the app raises."""
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(status: str, headers: list[tuple[str, str]],
                       exc_info: Any = None) -> Callable[[bytes], None]:
        if exc_info is not None and started:
            raise exc_info[1].with_traceback(exc_info[2])
        started[:] = [(status, list(headers))]
        return chunks.append

    chunks: list[bytes] = []
    result = app(env, start_response)
    try:
        for chunk in result:
            chunks.append(chunk)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    if not started:
        raise RuntimeError("the application did not call start_response")
    status, headers = started[0]
    return status, headers, b"".join(chunks)


def response(status: str, headers: list[tuple[str, str]], body: bytes, *, head_only: bool,
             keep_alive: bool) -> bytes:
    """The bytes of an HTTP/1.1 response with a Content-Length (the body is whole)."""
    lines = [f"HTTP/1.1 {status}"]
    for name, value in headers:
        if name.lower() in ("content-length", "connection", "transfer-encoding"):
            continue  # set below from what is actually sent
        lines.append(f"{name}: {value}")
    lines.append(f"Content-Length: {len(body)}")
    lines.append("Connection: " + ("keep-alive" if keep_alive else "close"))
    out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return out if head_only else out + body
