"""A real ``gpupack serve`` process for the HTTP tests: a free port, start it, wait until
``/readyz`` answers 200, stop it."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The benchmarks' server: `gpupack serve` plus their POST /echo baseline route.
ECHO_SERVE = Path(__file__).resolve().parents[2] / "bench" / "echo_serve.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(port: int, args: list[str], ready_s: float = 30.0,
            echo: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """``gpupack serve --port PORT ARGS``, ready; RuntimeError with its output if it is
    not within ``ready_s``. ``echo``: the benchmarks' server (``bench/echo_serve.py``),
    the same process with a ``POST /echo`` route added."""
    head = [str(ECHO_SERVE)] if echo else ["-m", "gpupack", "serve"]
    proc = subprocess.Popen(
        [sys.executable, *head, "--port", str(port), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + ready_s
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/readyz")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read().decode() if proc.stdout else ""
                raise RuntimeError(f"gpupack serve did not become ready:\n{out}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
