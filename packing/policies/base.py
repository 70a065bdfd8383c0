"""The policy interface and the plain greedy policy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from packing.model import PlanResult, Snapshot
from packing.policies.engine import greedy
from packing.scoring import Scorer
from packing.state import ClusterState
from packing.validate import validate


class InvalidPlan(RuntimeError):
    """A solver produced placements the validator rejects: a bug, never user error."""


ScorerFactory = Callable[[Snapshot], Scorer]


def fixed(scorer: Scorer) -> ScorerFactory:
    """A scorer that needs nothing from the snapshot (FGD, for one, needs its workload)."""
    return lambda _snapshot: scorer


class Policy(Protocol):
    name: str

    def make_scorer(self, snapshot: Snapshot) -> Scorer:
        """The per-option scorer for pods arriving one at a time on this snapshot."""
        ...

    def plan(self, snapshot: Snapshot) -> PlanResult:
        """Placements for every pending pod of the snapshot that can be placed."""
        ...


def checked(snapshot: Snapshot, result: PlanResult) -> PlanResult:
    """Return ``result`` after the one validator accepted it."""
    errors = validate(snapshot, result.placements, check_running=False)
    if errors:
        raise InvalidPlan(f"policy {result.policy} produced an invalid plan: {errors[:5]}")
    return result


class GreedyPolicy:
    """Place pods one by one with a scorer (see :mod:`packing.scoring`)."""

    def __init__(self, name: str, scorer_factory: ScorerFactory) -> None:
        self.name = name
        self._factory = scorer_factory

    def make_scorer(self, snapshot: Snapshot) -> Scorer:
        return self._factory(snapshot)

    def plan(self, snapshot: Snapshot) -> PlanResult:
        state = ClusterState(snapshot)
        placements, failed = greedy(
            state, snapshot.pending, self.make_scorer(snapshot), [p for p, _ in snapshot.running]
        )
        return checked(snapshot, PlanResult(tuple(placements), tuple(failed), self.name))
