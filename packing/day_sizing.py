"""What a replayed day (:mod:`packing.day`) needs: the fewest nodes of each pool on which
nobody waits (:func:`size_cluster`), and where the fragmentation is at the end of a
replay (:func:`pool_fragmentation`). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from packing.day import Day, DayResult, Placer, replay
from packing.model import Snapshot
from packing.policies.fgd import node_fragmentation, typical_shapes
from packing.state import ClusterState


@dataclass(frozen=True)
class Sizing:
    """The fewest nodes of each pool on which nothing waits all day (``served``).

    The search starts from the scenario's cluster when nothing waits on it, else from
    every pool at its most (``grow`` times its size), and then sizes the pools one by
    one, the pool with the most GPUs first: a pool's count is the smallest (by
    bisection) on which the day is served, with the pools sized before at their counts
    and the others where the search started. (Pools a policy can substitute for one
    another, MIG and time-sliced GPUs under gpupack's webhook, make the order matter:
    the first pool sized gives up the most.) ``served`` False: pods wait even with every
    pool at its most (the counts are the most)."""

    counts: Mapping[str, int]
    gpus: int
    nodes: int
    served: bool
    replays: int = field(default=0, compare=False)


def size_cluster(day: Day, make_placer: Callable[[], Placer], grow: int = 2) -> Sizing:
    """See :class:`Sizing`. Each trial is a full replay with a fresh placer."""
    replays = 0

    def served(c: Mapping[str, int]) -> bool:
        nonlocal replays
        replays += 1
        return replay(day.with_counts(c), make_placer(), record=False).served

    counts = {p.name: p.base for p in day.pools}
    ok = served(counts)
    if not ok:
        counts = {p.name: min(len(p.nodes), grow * p.base) for p in day.pools}
        ok = served(counts)
    if ok:
        for pool in sorted(day.pools,
                           key=lambda p: (-counts[p.name] * p.gpus_per_node, p.name)):
            lo, hi = 0, counts[pool.name]  # hi serves; find the least that does
            while lo < hi:
                mid = (lo + hi) // 2
                if served({**counts, pool.name: mid}):
                    hi = mid
                else:
                    lo = mid + 1
            counts[pool.name] = hi
    gpus = sum(counts[p.name] * p.gpus_per_node for p in day.pools)
    return Sizing(counts, gpus, sum(counts.values()), ok, replays)


@dataclass(frozen=True)
class PoolFragment:
    """A pool's free GPU capacity at the end of a replay, and how much of it the day's
    pods could not use (FGD's fragment measure over their typical shapes)."""

    pool: str
    nodes: int
    free_gpus: float
    unusable_gpus: float


def pool_fragmentation(day: Day, result: DayResult) -> list[PoolFragment]:
    """Where the fragmentation is at the end of ``result``, per pool of ``day``."""
    state = ClusterState(Snapshot(day.nodes, result.final))
    shapes = typical_shapes([req for req, _ in result.final])
    out = []
    for pool in day.pools:
        names = [n.name for n in pool.nodes[: pool.base] if n.name in state.nodes]
        free = sum(g.free_milli for n in names for g in state.nodes[n].gpus)
        frag = sum(node_fragmentation(state.nodes[n], shapes) for n in names)
        out.append(PoolFragment(pool.name, len(names), round(free / 1000, 2),
                                round(frag / 1000, 2)))
    return out
