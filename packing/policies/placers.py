"""The two schedulers of the day replay (:mod:`packing.day`), pod by pod.

``kube-scheduler``: a cluster without gpupack. Pods are admitted as written (they name
their device resource themselves), placed by the default profile's filter, score and
random tie-break, and given devices as the kubelet and the NVIDIA device plugin give
them (:mod:`packing.policies.kube_default`). An LLM group's pods are scheduled one by
one like any pods: a group can run in part, holding GPUs while its other pods wait.

``gpupack``: the same cluster with gpupack installed as shipped. Each pod is admitted
through an admission function the composition root passes in (the webhook's decision:
a pod that says how much GPU memory it needs gets the smallest MIG slice free now, else
a time-sliced share, where plain kube-scheduler would leave it waiting for the one
profile its manifest names). Its scheduler profile keeps kube-scheduler's default
plugins and adds the extender at weight 5 (``manifests/base/scheduler-config.yaml``):
the feasible nodes are those both kube-scheduler's filter and the extender's (gpupack's
view of slices, shares and whole GPUs) accept, and of these the extender's filter hands
back its best one (``gpupack serve --filter-top``, default 1), which kube-scheduler takes
without scoring; with ``filter_top`` 0 (every fitting node) or above 1, a node's total is
the default plugins' score plus ``weight x 10 x`` the extender's priority (10 for the
policy's winner alone, else 0..9 by the rank of gpupack's preference for the node among
the candidates, as ``scheduler/extender/verbs.py`` answers prioritize); ties at random;
and the extender binds the pod to gpupack's best option on the chosen node (which
slice, which GPU). Groups are placed whole or not at all
(:func:`packing.groups.placement.place_members`, as the extender reserves a group's room).
The preference is the extender's scorer (:func:`make_gpupack_scorer`), made from the
pods present (running and waiting) and made anew when their typical shapes change, as
the planner does (``SHAPE_TOLERANCE``). Not modelled: the background planner (the node
it plans for a pod gets 10 alone), which matters when many pods wait at once.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence

from packing.day import Day, DayPod
from packing.groups.placement import exclusive_domains_in_use, place_members
from packing.model import Placement, PodRequest, Snapshot
from packing.policies.fgd import Shape, typical_shapes
from packing.policies.gpupack import make_gpupack_scorer
from packing.policies.kube_default import (
    MAX_EXTENDER_PRIORITY,
    MAX_NODE_SCORE,
    default_scores,
    extender_priorities,
    kube_fits,
    place_default,
    preference,
    select_host,
)
from packing.scoring import Score, Scorer, in_use_first
from packing.state import ClusterState
from packing.status import Status

# gpupack's extender weight in its scheduler profile (manifests/base/scheduler-config.yaml).
EXTENDER_WEIGHT = 5
# The planner replaces its scorer when a typical shape's frequency moves by more (as
# scheduler/planner/loop.py's SHAPE_TOLERANCE).
SHAPE_TOLERANCE = 0.05

Admit = Callable[[DayPod, ClusterState, Sequence[PodRequest]], PodRequest | str]
Requests = Callable[[], list[PodRequest]]


def as_written(pod: DayPod, state: ClusterState, pending: Sequence[PodRequest]
               ) -> PodRequest | str:
    """No admission webhook: the pod asks for what its manifest names."""
    del state, pending
    return pod.request


class KubeSchedulerPlacer:
    name = "kube-scheduler"
    all_or_nothing = False

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(f"kube-scheduler:{seed}")
        self.workload_of: Callable[[str], str] = lambda _k: ""

    def start(self, day: Day, state: ClusterState, workload_of: Callable[[str], str],
              requests: Requests) -> None:
        del day, state, requests
        self.workload_of = workload_of

    def before_pass(self) -> None:
        pass

    def admit(self, pod: DayPod, state: ClusterState,
              pending: Sequence[PodRequest]) -> PodRequest | str:
        return as_written(pod, state, pending)

    def place(self, state: ClusterState, pod: PodRequest) -> Placement | None:
        return place_default(state, pod, self.workload_of(pod.key), self.workload_of,
                             self.rng)

    def place_group(self, state: ClusterState,
                    members: Sequence[PodRequest]) -> list[Placement] | None:
        raise NotImplementedError("kube-scheduler places a group's pods one by one")


class GpupackPlacer:
    name = "gpupack"
    all_or_nothing = True

    def __init__(self, admit: Admit = as_written, seed: int = 0,
                 exact_groups: bool = True, filter_top: int = 1) -> None:
        self._admit = admit
        self.filter_top = filter_top  # gpupack serve --filter-top (0: every fitting node)
        self.rng = random.Random(f"gpupack:{seed}")
        self.exact_groups = exact_groups
        self.workload_of: Callable[[str], str] = lambda _k: ""
        self.requests: Requests = list
        self.nodes: tuple = ()
        self.scorer: Scorer | None = None
        self._shapes: list[tuple[Shape, float]] = []
        self._keep: bool | None = None
        self.refreshes = 0

    def start(self, day: Day, state: ClusterState, workload_of: Callable[[str], str],
              requests: Requests) -> None:
        del state
        self.nodes = day.nodes
        self.workload_of = workload_of
        self.requests = requests

    def before_pass(self) -> None:
        """Make the scorer anew when the pods' typical shapes moved (the planner's rule)."""
        pods = self.requests()
        snap = Snapshot(self.nodes, pending=tuple(pods))
        shapes = typical_shapes(pods)
        keep = any(p.group is not None for p in pods)
        if self.scorer is not None and keep == self._keep and _close(shapes, self._shapes):
            return
        self._shapes, self._keep = shapes, keep
        self.scorer = make_gpupack_scorer(snap)
        self.refreshes += 1

    def admit(self, pod: DayPod, state: ClusterState,
              pending: Sequence[PodRequest]) -> PodRequest | str:
        return self._admit(pod, state, pending)

    def _best(self, state: ClusterState, pod: PodRequest, name: str
              ) -> tuple[Score, Placement] | None:
        assert self.scorer is not None
        best: tuple[Score, Placement] | None = None
        for o in state.options(pod, name, dedupe=True):
            if o.mig_created:
                continue  # no slice is created while the MIG actuator is off
            k = self.scorer(state, pod, o)
            if best is None or k < best[0]:
                best = (k, o)
        return best

    def place(self, state: ClusterState, pod: PodRequest) -> Placement | None:
        if self.scorer is None:
            self.before_pass()
        found: dict[str, tuple[Score, Placement]] = {}
        for name in state.nodes:
            if not kube_fits(state, pod, name):
                continue
            best = self._best(state, pod, name)
            if best is not None:
                found[name] = best
        if not found:
            return None
        prefs = {n: preference(k) for n, (k, _) in found.items()}
        if self.filter_top:
            # The extender's filter hands back its ``filter_top`` best nodes (verbs.py,
            # BestCandidates; the day's pods declare no soft preferences); one node
            # kube-scheduler takes without scoring.
            kept = sorted(prefs, key=lambda n: (prefs[n], in_use_first(state, n)))
            found = {n: found[n] for n in kept[: self.filter_top]}
            if len(found) == 1:
                return next(iter(found.values()))[1]
        names = list(found)
        extender = extender_priorities(prefs, names, state)
        scores = default_scores(state, pod, names, self.workload_of(pod.key),
                                self.workload_of)
        factor = EXTENDER_WEIGHT * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
        total = {n: scores[n] + factor * extender[n] for n in names}
        return found[select_host(total, self.rng)][1]

    def place_group(self, state: ClusterState,
                    members: Sequence[PodRequest]) -> list[Placement] | None:
        if self.scorer is None:
            self.before_pass()
        assert self.scorer is not None
        exclusive = [m for m in self.requests() if m.group is not None and m.group.exclusive]
        taken = exclusive_domains_in_use(state, exclusive)
        got = place_members(state, list(members), self.scorer, taken,
                            exact=self.exact_groups)
        if isinstance(got, Status):
            return None
        return list(got.placements)


def _close(a: list[tuple[Shape, float]], b: list[tuple[Shape, float]]) -> bool:
    if Counter(s for s, _ in a) != Counter(s for s, _ in b):
        return False
    wb = dict(b)
    return all(abs(w - wb[s]) <= SHAPE_TOLERANCE for s, w in a)
