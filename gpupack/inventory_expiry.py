"""``--inventory-max-age`` for the servers that watch a cluster (``serve``, ``webhook``):
the flag, its check, and the thread that re-reads nodes whose agent inventory has just
aged past it (``kube.inventory_age``; no watch event comes when an agent stops)."""

from __future__ import annotations

import argparse
import logging
import threading
from typing import TYPE_CHECKING

from kube.inventory_age import DEFAULT_MAX_AGE_S, InventoryAge

if TYPE_CHECKING:  # the cache is imported where a server is built, not by --help
    from kube.cache import ClusterCache

log = logging.getLogger("gpupack.inventory")

EXPIRY_CHECK_S = 5.0  # how often ages are checked (a scan of a dict of node names)


def add_inventory_age_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inventory-max-age", type=float, default=DEFAULT_MAX_AGE_S, metavar="S",
                   help="trust a node agent's inventory (MIG layouts, device owners, per-pod "
                        "GPU memory peaks) for S seconds after each write seen (on this "
                        "process's clock); not rewritten since, the "
                        "node is read as if it had none: GPUs inferred from allocatable and "
                        "GPU Feature Discovery labels (default 900: three of the agent's "
                        "5-minute refreshes missed; 0: no limit). Only against a cluster: "
                        "static files are never refreshed")


def inventory_age_error(args: argparse.Namespace) -> str | None:
    value = args.inventory_max_age
    if not value >= 0 or value == float("inf"):
        return f"--inventory-max-age {value!r}: must be 0 (no limit) or a positive number"
    return None


def inventory_age(args: argparse.Namespace, live: bool) -> InventoryAge | None:
    """The limit the cache applies: none for static files or ``--inventory-max-age 0``."""
    value = float(args.inventory_max_age)
    return InventoryAge(value) if live and value > 0 else None


def start_expiry(cache: ClusterCache, stop: threading.Event,
                 every_s: float = EXPIRY_CHECK_S) -> threading.Thread | None:
    """Run ``cache.expire_inventories`` every ``every_s`` until ``stop``; None (no
    thread) when the cache has no limit. A failing pass is logged and the loop goes on."""
    if cache.inventory_age is None:
        return None

    def loop() -> None:
        while not stop.wait(every_s):
            try:
                cache.expire_inventories()  # the cache logs each node it stops trusting
            except Exception:
                log.exception("expiring node agent inventories failed")

    t = threading.Thread(target=loop, name="gpupack-inventory-expiry", daemon=True)
    t.start()
    return t
