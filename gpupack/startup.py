"""The one line a server prints when it starts answering: which command, where its
cluster view comes from, what it loaded and where it listens. Printed to stderr whatever
the log level, once the first complete list is in (at once for static files)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence


def source_words(args: argparse.Namespace, default: str | None = None) -> str:
    """Where the cluster view comes from, as a person would say it."""
    if getattr(args, "in_cluster", False):
        return "mode in-cluster (API server, service account)"
    if getattr(args, "kubeconfig", None):
        return f"mode kubeconfig {args.kubeconfig}"
    nodes, pods = getattr(args, "nodes", None), getattr(args, "pods", None)
    if nodes is not None:
        return f"mode static (files {nodes}" + (f", {pods})" if pods is not None else ")")
    return f"mode static ({default})" if default else "mode static"


def startup_line(command: str, source: str, counts: Mapping[str, int],
                 listening: Sequence[str], details: Sequence[str] = ()) -> str:
    """``gpupack serve: ready: mode static (...); 6 nodes, 12 pods (7 pending) loaded;
    policy gpupack; listening on http://127.0.0.1:8888``."""
    loaded = (f"{counts.get('nodes', 0)} nodes, {counts.get('pods', 0)} pods "
              f"({counts.get('pending', 0)} pending) loaded")
    parts = [source, loaded, *details, f"listening on {', '.join(listening)}"]
    return f"gpupack {command}: ready: " + "; ".join(parts)


def announce(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def announce_when_synced(synced: Callable[[], bool], line: Callable[[], str],
                         poll_s: float = 0.1) -> threading.Thread:
    """A daemon thread that prints ``line()`` once ``synced()`` is true."""
    def wait() -> None:
        while not synced():
            time.sleep(poll_s)
        announce(line())

    thread = threading.Thread(target=wait, name="gpupack-startup-line", daemon=True)
    thread.start()
    return thread
