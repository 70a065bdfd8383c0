"""Cache holds of the MIG actuator's changes and compaction's drains: a :class:`Hold` as
the (request, placement) the cache counts, and a sync that holds exactly what a decision
wants among one prefix's keys."""

from __future__ import annotations

import logging

from kube.cache import ClusterCache
from packing.model import Placement, PodRequest, RequestKind
from scheduler.mig_actuator import Hold

log = logging.getLogger("gpupack.scheduler.mig")


def sync_holds(cache: ClusterCache, wanted: tuple[Hold, ...] | list[Hold], prefix: str,
               keep: frozenset[str] | set[str] = frozenset()) -> None:
    """Hold exactly ``wanted`` (and leave ``keep`` alone) among the cache's holds whose
    keys start with ``prefix`` (the actuator's changes, or compaction's drains)."""
    want = {h.key: h for h in wanted}
    with cache.lock:
        for k in [k for k in cache.holds() if k.startswith(prefix)]:
            if k not in want and k not in keep:
                cache.unhold(k)
        current = cache.holds()
        for k, h in want.items():
            if k in current:
                continue
            req, p = mig_hold_request(h)
            why = cache.hold(req, p)
            if why is not None:
                log.warning("MIG hold %s not taken: %s", k, why)


def mig_hold_request(h: Hold) -> tuple[PodRequest, Placement]:
    if h.profile is None:
        return (PodRequest(h.key, kind=RequestKind.WHOLE, gpu_count=1),
                Placement(h.key, h.node, (h.gpu,)))
    return (PodRequest(h.key, kind=RequestKind.MIG, mig_profile=h.profile),
            Placement(h.key, h.node, (h.gpu,), mig_profile=h.profile, mig_start=h.start))
