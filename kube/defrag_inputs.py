"""What ``gpupack defrag`` reads besides the cluster snapshot: the pods file's
PodDisruptionBudgets (it may be a List of mixed kinds) and, for every pod, whether a
controller recreates it once evicted (:class:`packing.defrag.Evictability`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kube.objects import pod_key
from kube.owners import RECREATING_KINDS, recreator
from kube.pdb import read_budget, terminating
from packing.defrag import Evictability

PDB = "PodDisruptionBudget"


def evictability(pods: Sequence[Mapping[str, Any]], budgets: Iterable[Mapping[str, Any]],
                 kinds: Iterable[str] = RECREATING_KINDS) -> Evictability:
    """Which pods a controller recreates, and the budgets; ObjectError naming the field."""
    kinds = frozenset(kinds)
    recreated: dict[str, str] = {}
    blocked: dict[str, str] = {}
    for pod in pods:
        key = pod_key(pod)
        who, why = recreator(pod, kinds)
        if who is not None:
            recreated[key] = who
        else:
            blocked[key] = why
        if terminating(pod):
            blocked[key] = "already terminating"
    return Evictability(recreated, tuple(read_budget(b, pods) for b in budgets), blocked)
