"""A real gunicorn server with a gated worker and a test app, for tests/serving.

    python gunicorn_harness.py PORT gated|sticky THREADS

Limits are short (head/body 1 s, write 1 s, max body 64 KiB) so the tests run in
seconds. The app: ``/block?S`` and ``/metrics?S`` sleep S seconds; a declared body over
the limit is answered 413 (unread), others with the path and the body's length.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from gpupack.sticky_worker import StickyThreadWorker
from serving.gate import Limits
from serving.gunicorn_worker import GatedThreadWorker

LIMITS = Limits(head_s=1.0, body_s=1.0, write_s=1.0, idle_s=5.0, linger_s=0.5,
                max_body=64 * 1024, max_connections=48)


def app(env: dict[str, Any], start: Callable[..., Any]) -> list[bytes]:
    path = env["PATH_INFO"]
    if path in ("/block", "/metrics"):  # a stuck verb; a scrape waiting for its turn
        time.sleep(float(env.get("QUERY_STRING") or "3"))
    length = int(env.get("CONTENT_LENGTH") or 0)
    if length > LIMITS.max_body:
        start("413 Content Too Large", [("Content-Type", "text/plain")])
        return [b"too large"]
    body = env["wsgi.input"].read(length) if length else b""
    start("200 OK", [("Content-Type", "text/plain")])
    return [f"{path} {len(body)}".encode()]


class Server(BaseApplication):
    def __init__(self, port: int, worker: type[GatedThreadWorker], threads: int) -> None:
        self.settings = {
            "bind": f"127.0.0.1:{port}", "workers": 1, "threads": threads,
            "worker_class": worker.configured(LIMITS, oversize="dispatch"),
            "keepalive": 5, "accesslog": None, "loglevel": "warning",
            "control_socket_disable": True, "graceful_timeout": 2,
        }
        super().__init__()

    def load_config(self) -> None:
        for k, v in self.settings.items():
            self.cfg.set(k, v)

    def load(self) -> Any:
        return app


if __name__ == "__main__":
    port, kind, threads = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    Server(port, StickyThreadWorker if kind == "sticky" else GatedThreadWorker, threads).run()
