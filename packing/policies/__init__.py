"""Placement policies, chosen by name from a registry.

``spread`` (kube-scheduler's LeastAllocated), ``bestfit``, ``fgd`` (fragmentation
gradient descent, Weng et al., ATC'23), ``random`` (a seeded baseline) and ``gpupack``
(greedy with gpupack's objectives, then CP-SAT over the batch). Every policy returns a
:class:`~packing.model.PlanResult` whose placements passed :func:`packing.validate.validate`.
"""

from __future__ import annotations

from collections.abc import Callable

from packing.policies.base import GreedyPolicy, Policy, fixed
from packing.policies.fgd import make_fgd_scorer
from packing.policies.gpupack import GpupackPolicy, make_gpupack_scorer
from packing.policies.scores import bestfit, random_scorer, spread

PolicyFactory = Callable[[], Policy]

REGISTRY: dict[str, PolicyFactory] = {
    "spread": lambda: GreedyPolicy("spread", fixed(spread)),
    "bestfit": lambda: GreedyPolicy("bestfit", fixed(bestfit)),
    "fgd": lambda: GreedyPolicy("fgd", make_fgd_scorer),
    "random": lambda: GreedyPolicy("random", fixed(random_scorer)),
    "gpupack-greedy": lambda: GreedyPolicy("gpupack-greedy", make_gpupack_scorer),
    "gpupack": GpupackPolicy,
}


def get_policy(name: str) -> Policy:
    try:
        return REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def policy_names() -> list[str]:
    return list(REGISTRY)


__all__ = ["REGISTRY", "GreedyPolicy", "Policy", "get_policy", "policy_names"]
