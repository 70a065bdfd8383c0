"""Where the cache counts a bound pod, and what the node agents observed.

A pod the API shows bound holds GPUs the cache must count, but the API does not say
which: the node agent saw it (the GPU of its time-sliced replica, the MIG instance it
owns), gpupack recorded it at bind time (``gpupack.io/gpus``, ``gpupack.io/mig``), or
neither, and then it is where the device plugin would have put it, else counted without
GPUs. :class:`Observations` keeps each node's agent observation (read again only when
the inventory text changes) and answers, for a pod entry on a state, where it is
counted (:meth:`Observations.placement_for`), whether a count still agrees with what is
known (:meth:`Observations.agrees`), its GPU memory as counted (declared, or its
observed peak with headroom), and whether a share is still a guess. It counts the
disagreements between gpupack's prediction and the agent's first sight.

Called by :class:`kube.cache.ClusterCache` under its lock; nothing here takes a lock.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from kube.constraints import PodConstraints
from kube.node_objects import NO_OBSERVATION, NodeObservation, observation_of
from kube.snapshot import observed_share, owned_instance, with_observed_peak
from packing.model import Placement, PodRequest, RequestKind
from packing.state import ClusterState, plugin_pick, share_is_a_guess

log = logging.getLogger("gpupack.kube.cache")
IGNORED_NOTES_CAP = 10_000  # distinct ignored placements remembered (see note_ignored)


def as_counted(state: ClusterState, p: Placement) -> Placement:
    """``p`` as the cache counts it: a MIG slice the view's layout does not have yet is
    counted as created (so giving it back removes it again, instead of leaving a free
    slice that does not exist); one it has, as existing."""
    if p.mig_profile is None or p.mig_start is None or not p.gpus:
        return p
    exists = p.mig_start in state.gpu(p.node, p.gpus[0]).instances
    return p if p.mig_created != exists else replace(p, mig_created=not exists)


def same_slot(a: Placement | None, b: Placement) -> bool:
    """Equal placements, whether or not the slice was counted as created."""
    return a is not None and replace(a, mig_created=False) == replace(b, mig_created=False)


@dataclass(slots=True)
class PodEntry:
    """A pod as the watch last showed it."""

    req: PodRequest
    uid: str
    node: str | None  # spec.nodeName
    scheduler: str
    finished: bool
    recorded: Placement | None  # the placement gpupack recorded in the pod's annotations
    # Where it may run and which quota scopes cover it (kube.constraints), read for GPU
    # pods and group members only (what a group's rights depend on); a string says why
    # it could not be read.
    constraints: PodConstraints | str | None = None
    started: float | None = None  # status.startTime (kube.objects.started_at)
    # Why its gpupack inputs could not be read: it is bound and counted at its worst
    # (kube.worst_case); None when they were read.
    unreadable: str | None = None


class Observations:
    """The node agents' observations, and where a bound pod is counted (see the module
    docstring)."""

    def __init__(self) -> None:
        # What each node's agent observed (kube.node_objects.NodeObservation), by node, with
        # the inventory text it was read from (read again only when that changes).
        self.obs: dict[str, NodeObservation] = {}
        self.text: dict[str, str | None] = {}
        # The observed placement of each pod last compared with gpupack's, and the
        # disagreements found (by kind: shared, mig): the device plugin or the node
        # put a pod elsewhere than gpupack predicted or recorded.
        self.seen: dict[str, Placement] = {}
        self.disagreements: dict[str, int] = {"shared": 0, "mig": 0}
        # Placements already reported as ignored: a node is re-counted on every change of
        # it, and the same mismatch must not fill the log each time (bounded: forgotten
        # wholesale past a cap, so a mismatch is at worst reported again).
        self.ignored_noted: set[tuple[str, str, str]] = set()

    def of(self, node: str) -> NodeObservation:
        return self.obs.get(node, NO_OBSERVATION)

    def update(self, node: str, text: str | None) -> bool:
        """Read node ``node``'s inventory ``text`` (None: none, or not trusted); whether
        what it observes is unchanged."""
        if node in self.text and self.text[node] == text:
            return True
        self.text[node] = text
        obs = observation_of(text, node)
        seen = self.obs.get(node, NO_OBSERVATION) == obs
        self.obs[node] = obs
        return seen

    def forget_node(self, node: str) -> None:
        self.obs.pop(node, None)
        self.text.pop(node, None)

    def forget_pod(self, key: str) -> None:
        self.seen.pop(key, None)

    def is_guess(self, req: PodRequest, p: Placement, state: ClusterState) -> bool:
        """Whether share ``req`` counted at ``p`` is gpupack's guess of where the device
        plugin put it (packing.state.share_is_a_guess) on a node whose agent will say:
        then it counts at its worst for later shares until the agent has seen it. On a
        node without an agent the prediction is all there is."""
        if req.kind is not RequestKind.SHARED or not p.gpus or p.node not in state.nodes:
            return False
        if self.text.get(p.node) is None:
            return False
        if observed_share(self.obs.get(p.node), p.node, req) is not None:
            return False
        return share_is_a_guess(state.nodes[p.node], p)

    def placement_for(self, entry: PodEntry, state: ClusterState) -> Placement | None:
        """Where a bound pod sits in ``state``: where the node
        agent saw it (its time-sliced GPU, its MIG instance), else what gpupack
        recorded, else the first free fit (the GPU the device plugin would pick), else
        CPU and memory only. The answer can
        always be applied to ``state`` with over-commit; None when the node is unknown."""
        assert entry.node is not None
        if entry.node not in state.nodes:
            return None
        # What the node agent observed wins over any record: the device plugin picked
        # the replica, and the pod holds the MIG slice it holds.
        candidates = (
            (self.observed_placement(entry, state), "placement the node agent observed"),
            (entry.recorded, "recorded placement"),
        )
        for p, what in candidates:
            if p is None:
                continue
            why = state.shape_error(entry.req, p)
            if why is None:
                return p
            self.note_ignored(entry, what, p, why)
        # Where it could be holding GPUs: a cordoned or CPU-full node still has them.
        options = state.options(entry.req, entry.node, gpus_only=True)
        if options:
            return options[0]
        # A share nobody has seen yet is where the device plugin put it, room or not.
        pick = plugin_pick(state.nodes[entry.node]) if entry.req.kind is RequestKind.SHARED \
            else None
        if pick is not None:
            return Placement(entry.req.key, entry.node, (pick.first,))
        # Bound by someone else with no room we can see (our view lags, the node over-
        # commits, or its devices do not match what we know of the node): count its CPU
        # and memory at least, GPUs unknown.
        return Placement(entry.req.key, entry.node)

    def note_ignored(self, entry: PodEntry, what: str, p: Placement, why: str) -> None:
        """Log once per pod, source and placement that a placement was ignored, and why."""
        key = (entry.req.key, what, str(p.to_json()))
        if key in self.ignored_noted:
            return
        if len(self.ignored_noted) >= IGNORED_NOTES_CAP:
            self.ignored_noted.clear()
        self.ignored_noted.add(key)
        log.warning("pod %s on %s: %s %s ignored: %s", entry.req.key, entry.node, what,
                    p.to_json(), why)

    def observed_placement(self, entry: PodEntry, state: ClusterState) -> Placement | None:
        """Where the node agent saw bound pod ``entry``: the GPU of its time-sliced
        replica, or the MIG instance it owns (None when not seen)."""
        assert entry.node is not None
        n = state.nodes.get(entry.node)
        if n is None:
            return None
        if entry.req.kind is RequestKind.MIG:
            return owned_instance(n.info, entry.req)
        return observed_share(self.obs.get(entry.node), entry.node, entry.req)

    def effective(self, entry: PodEntry) -> PodEntry:
        """``entry`` with its GPU memory as counted: a time-sliced pod's declared need or
        its observed peak plus headroom, whichever is larger (the rule of ``plan``)."""
        obs = self.obs.get(entry.node or "")
        if obs is None or entry.req.kind is not RequestKind.SHARED:
            return entry
        req = with_observed_peak(entry.req, obs.peaks.get(entry.req.key))
        return entry if req is entry.req else replace(entry, req=req)

    def agrees(self, entry: PodEntry, p: Placement, state: ClusterState) -> bool:
        """Whether ``p`` is where the pod should be counted: where the node agent saw it,
        else (not seen) where gpupack recorded it, if it did."""
        observed = self.observed_placement(entry, state)
        if observed is not None:
            node = state.nodes.get(p.node)
            if node is not None and entry.req.key in node.unsure:
                return False  # a guess the agent has now seen: count it as seen
            return same_slot(observed, p)
        return entry.recorded is None or same_slot(entry.recorded, p)

    def note_observation(self, entry: PodEntry, before: Placement | None,
                         state: ClusterState) -> None:
        """Count a disagreement when the node agent's first sight of a pod's placement
        (or a changed one) differs from where gpupack counted (predicted) it."""
        observed = self.observed_placement(entry, state)
        key = entry.req.key
        if observed is None or self.seen.get(key) == observed:
            return
        self.seen[key] = observed
        before = before if before is not None and before.gpus else entry.recorded
        if before is not None and before.gpus and not same_slot(observed, before):
            kind = "mig" if entry.req.kind is RequestKind.MIG else "shared"
            self.disagreements[kind] += 1
            log.info("pod %s on %s: the node agent saw %s, gpupack counted %s; counting "
                     "the observation", key, entry.node, observed.to_json(), before.to_json())
