"""Defragmentation's metrics (registered by every extender, zero when it is off, so the
dashboards and alerts always have their series): moves planned, evictions by outcome,
GPUs freed, campaigns stopped by reason, the campaign in progress, and how long a group
waited for the room a campaign freed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kube.evictions import OUTCOMES
from scheduler.defrag.decide import STOP_REASONS

WAIT_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)


class DefragMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        reg = registry if registry is not None else CollectorRegistry()
        self.planned = Counter("gpupack_defrag_moves_planned",
                               "Moves planned for waiting groups (plan: each new move told; "
                               "act: each move started)", registry=reg)
        self.evictions = Counter("gpupack_defrag_evictions",
                                 "Evictions asked of the Eviction API, by outcome (evicted; "
                                 "refused: pdb = 429, forbidden = 403, error; gone)",
                                 ["outcome"], registry=reg)
        for o in OUTCOMES:
            self.evictions.labels(o)
        self.freed = Counter("gpupack_defrag_gpus_freed",
                             "GPUs freed by evictions and handed to a waiting group",
                             registry=reg)
        self.stopped = Counter("gpupack_defrag_campaigns_stopped",
                               "Campaigns ended, by reason", ["reason"], registry=reg)
        for r in STOP_REASONS:
            self.stopped.labels(r)
        self.active = Gauge("gpupack_defrag_active",
                            "1 while a campaign frees a domain for a group", registry=reg)
        self.wait = Histogram("gpupack_defrag_group_wait_seconds",
                              "Seconds from a group first waiting to its room being reserved, "
                              "for groups the defragmenter freed room for",
                              buckets=WAIT_BUCKETS, registry=reg)
