"""What one exchange with a child process costs (scheduler/child.py): the solver and the
warm scorer each run in a long-lived child, and the warmer sends it many small batches.

Times ``ChildProcess.exchange`` (what ships: a message over ``DIRECT_SEND_BYTES`` is sent
from a helper thread, so a child that never reads cannot block the caller for ever) and,
in the same run, a baseline that sends on the caller's thread with no time limit on the
send, for a small and a large message. Prints microseconds per exchange and the ratio.

Run: ``python bench/child_exchange.py [--n 2000] [--small 2000] [--large 1000000]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.child import DIRECT_SEND_BYTES, ChildProcess, serve_messages


def echo_main(conn: Connection) -> None:
    serve_messages(conn, lambda msg: msg)


def direct(child: ChildProcess, msg: Any) -> Any:
    """The baseline: send on the caller's thread (blocks for ever on a deaf child)."""
    conn = child.ensure()
    conn.send(msg)
    conn.poll(30.0)
    return conn.recv()


def per_exchange_us(fn: Any, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="exchanges per figure")
    ap.add_argument("--small", type=int, default=2000, help="bytes of the small message")
    ap.add_argument("--large", type=int, default=1_000_000, help="bytes of the large one")
    args = ap.parse_args(argv)
    # The child imports its target by module (scheduler.child spawns with a bare
    # __main__): this file's function under its module name.
    from importlib import import_module

    target = import_module("bench.child_exchange").echo_main
    child = ChildProcess(target, "gpupack-bench-echo")
    try:
        child.exchange(b"", 30.0)  # started
        print(f"direct send limit: {DIRECT_SEND_BYTES} bytes")
        for label, size, n in (("small", args.small, args.n),
                               ("large", args.large, max(1, args.n // 20))):
            msg = b"x" * size
            shipped = per_exchange_us(lambda m=msg: child.exchange(m, 30.0), n)
            base = per_exchange_us(lambda m=msg: direct(child, m), n)
            print(f"{label} ({size} bytes, {n} exchanges): shipped {shipped:.0f} us, "
                  f"send on the caller's thread {base:.0f} us, ratio {shipped / base:.2f}")
    finally:
        child.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
