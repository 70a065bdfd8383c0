"""Cache holds of the MIG actuator's changes and compaction's drains: a :class:`Hold` as
the (request, placement) the cache counts, and a sync that holds exactly what a decision
wants among one prefix's keys."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from kube.cache import ClusterCache
from packing.model import Placement, PodRequest, RequestKind
from scheduler.mig.decide import Hold

log = logging.getLogger("gpupack.scheduler.mig")


def sync_holds(cache: ClusterCache, wanted: Sequence[Hold], prefix: str,
               keep: Callable[[str], bool] = lambda _key: False) -> None:
    """Hold exactly ``wanted`` among the cache's holds whose keys start with ``prefix``
    (the actuator's changes, or compaction's drains), leaving those ``keep`` says alone."""
    want = {h.key: h for h in wanted}
    with cache.lock:
        for k in [k for k in cache.holds() if k.startswith(prefix)]:
            if k not in want and not keep(k):
                cache.unhold(k)
        current = cache.holds()
        for k, h in want.items():
            if k not in current:
                hold_one(cache, h)


def hold_one(cache: ClusterCache, h: Hold) -> str | None:
    """Take one hold; why not (logged) when its GPU or instance is no longer free."""
    req, p = mig_hold_request(h)
    why = cache.hold(req, p)
    if why is not None:
        log.warning("MIG hold %s not taken: %s", h.key, why)
    return why


def take_holds(cache: ClusterCache, holds: Sequence[Hold]) -> str | None:
    """All of ``holds`` or none (under the cache lock): on the first that cannot be had,
    give back every one of ``holds`` had so far (those held before the call included)
    and say why."""
    taken: list[Hold] = []
    with cache.lock:
        current = cache.holds()
        for h in holds:
            if h.key in current:
                taken.append(h)
                continue
            why = hold_one(cache, h)
            if why is not None:
                for t in taken:
                    cache.unhold(t.key)
                return f"GPU {h.gpu} of {h.node}: {why}"
            taken.append(h)
    return None


def mig_hold_request(h: Hold) -> tuple[PodRequest, Placement]:
    if h.profile is None:
        return (PodRequest(h.key, kind=RequestKind.WHOLE, gpu_count=1),
                Placement(h.key, h.node, (h.gpu,)))
    return (PodRequest(h.key, kind=RequestKind.MIG, mig_profile=h.profile),
            Placement(h.key, h.node, (h.gpu,), mig_profile=h.profile, mig_start=h.start))
