"""Hostile clients against a listener on loopback, and how fast it still answers; with
``--tenant``, a hostile tenant against the real control plane.

    python bench/hostile.py --port 8888 [--tls] --kind slow-head --clients 64 --seconds 8
        [--path /healthz] [--path /filter:@body.json] ...
    python bench/hostile.py --tenant [--dir DIR] [--format table|json]

``--tenant`` (bench/tenant_attacks.py) replays the attacks of issue 35 as someone who may
only create pods in their own namespace (forged admission reviews, free reservations,
exclusive-domain squatters, an unreadable annotation after binding) and with the
extender's own token, on a stack it starts, and prints what each achieves now beside
what the issue measured; exit status 1 if any attack still works.

Kinds (each client keeps one connection doing this; when the server cuts it, it
reconnects, so the pressure stays at ``--clients`` until the end):

- ``slow-head``: a request head sent one byte per ``--drip`` seconds, never finished;
- ``slow-body``: a whole head announcing a 1 MB body, then one byte per ``--drip``;
- ``half-tls``: the first 3 bytes of a TLS ClientHello, then nothing;
- ``slow-tls``: a finished TLS handshake, then a head one byte per ``--drip``;
- ``idle``: connected, sending nothing;
- ``scrape``: GET ``/metrics`` in a loop, reading the whole answer.

While they run, each ``--path`` is requested on a fresh connection every 0.2 s and the
answer times are printed (max and p50), with the number of times the server cut a
hostile client. Only 127.0.0.1 is ever contacted; every loop is bounded by --seconds.
Used by ``tests/serving/test_serving_hostile.py`` (the functions below) as well.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import socket
import ssl
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"  # never anything else
KINDS = ("slow-head", "slow-body", "half-tls", "slow-tls", "idle", "scrape")


@functools.cache
def client_context() -> ssl.SSLContext:
    """One context for all (loading the system's CA store takes ~20 ms each time)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


@dataclass
class Crowd:
    """``clients`` connections of one kind against ``HOST:port``, driven by one thread."""

    port: int
    kind: str
    clients: int
    drip_s: float = 0.5
    cut: int = 0  # connections the server closed (then reopened)
    served: int = 0  # scrapes answered (kind scrape)
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.kind!r}")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Crowd:
        n_threads = self.clients if self.kind == "scrape" else 1
        for i in range(n_threads):
            t = threading.Thread(target=self._scrape if self.kind == "scrape" else self._drive,
                                 name=f"crowd-{self.kind}-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def __enter__(self) -> Crowd:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- one thread drips on every connection
    def _open(self) -> tuple[socket.socket, bytes]:
        s = socket.create_connection((HOST, self.port), timeout=5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        if self.kind == "half-tls":
            s.sendall(b"\x16\x03\x01")
            return s, b""
        if self.kind == "idle":
            return s, b""
        if self.kind == "slow-tls":
            s = client_context().wrap_socket(s)
            return s, head + b"X-Slow: " + b"a" * 100_000
        if self.kind == "slow-body":
            s.sendall(head + b"Content-Length: 1000000\r\n\r\n")
            return s, b"[" * 1_000_000
        return s, head + b"X-Slow: " + b"a" * 100_000

    def _drive(self) -> None:
        conns: list[list[object]] = []
        while not self._stop.is_set() and len(conns) < self.clients:
            try:
                s, rest = self._open()
                conns.append([s, rest])
            except OSError as e:
                self.errors.append(str(e))
                time.sleep(0.05)
        while not self._stop.wait(self.drip_s):
            for c in conns:
                s, rest = c
                assert isinstance(s, socket.socket) and isinstance(rest, bytes)
                try:
                    if rest:
                        s.send(rest[:1])
                        c[1] = rest[1:]
                    else:
                        # Nothing to send: see whether the server has closed it.
                        s.setblocking(False)
                        try:
                            if s.recv(65536) == b"":
                                raise ConnectionResetError("closed by the server")
                        except (BlockingIOError, ssl.SSLWantReadError):
                            pass
                        finally:
                            s.setblocking(True)
                except (OSError, ssl.SSLError):
                    self.cut += 1
                    s.close()
                    try:
                        c[0], c[1] = self._open()
                    except OSError as e:
                        self.errors.append(str(e))
        for c in conns:
            s = c[0]
            assert isinstance(s, socket.socket)
            s.close()

    def _scrape(self) -> None:
        while not self._stop.is_set():
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=10)
                conn.request("GET", "/metrics")
                conn.getresponse().read()
                conn.close()
                self.served += 1
            except OSError as e:
                self.errors.append(str(e))
                time.sleep(0.05)


def probe(port: int, path: str, body: bytes | None = None, *, tls: bool = False,
          timeout: float = 10.0) -> tuple[int, float]:
    """(status, seconds) of one request on a fresh connection; status 0 when it failed."""
    started = time.perf_counter()
    try:
        conn: http.client.HTTPConnection
        if tls:
            conn = http.client.HTTPSConnection(HOST, port, timeout=timeout,
                                               context=client_context())
        else:
            conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
        conn.request("POST" if body is not None else "GET", path, body=body,
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status, time.perf_counter() - started
    except OSError:
        return 0, time.perf_counter() - started


def main() -> int:
    if "--tenant" in sys.argv[1:]:
        t = argparse.ArgumentParser(description="a hostile tenant (bench/tenant_attacks.py)")
        t.add_argument("--tenant", action="store_true", required=True)
        t.add_argument("--dir", type=Path, default=None,
                       help="the stack's folder (default: a temporary one)")
        t.add_argument("--format", choices=("table", "json"), default="table")
        ta = t.parse_args()
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import tenant_attacks

        return tenant_attacks.run(ta.dir, ta.format)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tls", action="store_true", help="the listener speaks HTTPS")
    p.add_argument("--kind", choices=KINDS, action="append", required=True)
    p.add_argument("--clients", type=int, default=64, help="per kind (default 64)")
    p.add_argument("--drip", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--path", action="append", default=[],
                   help="PATH to GET, or PATH:@FILE to POST the file (repeatable)")
    a = p.parse_args()
    targets: list[tuple[str, bytes | None]] = []
    for spec in a.path or ["/healthz"]:
        path, _, file = spec.partition(":@")
        targets.append((path, Path(file).read_bytes() if file else None))
    crowds = [Crowd(a.port, k, a.clients, a.drip).start() for k in a.kind]
    time.sleep(min(1.0, a.seconds / 4))  # let them connect
    times: dict[str, list[float]] = {path: [] for path, _ in targets}
    failed: dict[str, int] = {path: 0 for path, _ in targets}
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        for path, body in targets:
            status, took = probe(a.port, path, body, tls=a.tls)
            times[path].append(took)
            failed[path] += status != 200
        time.sleep(0.2)
    for c in crowds:
        c.stop()
    print(f"kinds {','.join(a.kind)} x {a.clients} clients, {a.seconds:.0f} s")
    for path, ts in times.items():
        print(f"  {path:12s} n={len(ts):3d} p50={statistics.median(ts) * 1e3:8.1f} ms "
              f"max={max(ts) * 1e3:8.1f} ms  not-200={failed[path]}")
    for c in crowds:
        print(f"  {c.kind:10s} cut by the server {c.cut} times, scrapes {c.served}, "
              f"client errors {len(c.errors)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
