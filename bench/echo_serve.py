"""``gpupack serve`` with one route more, for the benchmarks: ``POST /echo``.

The extender benchmarks compare each verb's latency with an echo: a request of the same
size through the same process, gunicorn worker, Flask routing and JSON response (orjson)
but no cluster work, so what a verb costs beyond HTTP shows. The echo is the
benchmark's, not the product's: this script runs ``gpupack serve``'s own argument
checks and server (:func:`gpupack.serve_cmd.run`) and adds the route to the app the
worker builds, right after it is built and before it serves.

    python bench/echo_serve.py [gpupack serve arguments...]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
from flask import Flask, Response, request

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpupack.cli import build_parser
from gpupack.serve_cmd import ExtenderServer, run


def add_echo(app: Flask) -> Flask:
    """Answer ``POST /echo`` with ``{"bytes": <request body length>}``."""

    def echo() -> Response:
        return Response(orjson.dumps({"bytes": len(request.get_data())}),
                        mimetype="application/json")

    app.add_url_rule("/echo", "bench_echo", echo, methods=["POST"])
    return app


class EchoExtenderServer(ExtenderServer):
    """The extender's gunicorn application, its app with the echo route."""

    def load(self) -> Any:
        return add_echo(super().load())


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(["serve", *argv])
    return run(args, server=EchoExtenderServer)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
