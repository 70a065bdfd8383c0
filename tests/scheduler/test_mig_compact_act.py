"""MIG compaction's handler (scheduler/mig/compact/loop.py) inside the actuator's step, on a
real cache with a fake Eviction API: drains start on the leader only, the drained GPU's
free instances are held before the eviction, the evicted pod's slice is held the moment
it goes, an emptied drain gives everything back, a refused eviction ends the drain and
cools the GPU down, a standby holds nothing; Events and metrics."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sched_builders import FakeClock, make_cache, node, pod
from test_mig_loop import FAST, FakeApi

from kube.annotations import placement_annotations
from kube.defrag.inputs import PodOwners
from kube.evictions import EvictionResult, PodRef
from packing.model import Placement
from scheduler.mig.compact.decide import DRAIN_PREFIX, CompactSettings
from scheduler.mig.compact.loop import CompactMetrics, Compactor
from scheduler.mig.decide import MigSettings
from scheduler.mig.loop import MigActuator

OWNED = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "asr", "uid": "rs-1",
          "controller": True}]


def asr_on(name: str, gpu: int, start: int, owned: bool = True, kind: str = "ReplicaSet",
           uid: str | None = None) -> dict[str, Any]:
    key = f"default/{name}"
    p = pod(name, {"nvidia.com/mig-1g.10gb": "1"}, node="a", uid=uid,
            annotations=placement_annotations(
                Placement(key, "a", (gpu,), "1g.10gb", start), "gpupack"))
    if owned:
        p["metadata"]["ownerReferences"] = [{**OWNED[0], "kind": kind}]
    return p


class FakeEvictor:
    def __init__(self, outcome: str = "evicted") -> None:
        self.outcome = outcome
        self.asked: list[str] = []

    def evict(self, ref: PodRef) -> EvictionResult:
        self.asked.append(ref.key)
        return EvictionResult(self.outcome, "" if self.outcome == "evicted" else "budget")


class FakeEvents:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, str]] = []

    def emit(self, pod: PodRef, reason: str, message: str, warning: bool = False) -> None:
        self.emitted.append((pod.key, reason))


def setup(outcome: str = "evicted", leader: list[bool] | None = None, lone_owned: bool = True,
          on_gpu0: list[dict[str, Any]] | None = None, min_age: float = 0,
          memory: Any = None, per_hour: int = 120
          ) -> tuple[Any, MigActuator, FakeEvictor, FakeApi, FakeEvents, FakeClock,
                     CollectorRegistry]:
    # GPU 0 holds one ASR pod (or on_gpu0); GPU 1 holds three and has four free 1g slices.
    first = on_gpu0 if on_gpu0 is not None else [asr_on("lone", 0, 0, lone_owned)]
    pods = first + [asr_on(f"p{i}", 1, i) for i in range(3)]
    cache = make_cache([node("a", gpus=2, mig={"1g.10gb": 14})], [])
    owners = PodOwners(cache)
    owners.replace(None, pods)
    clock = FakeClock()
    api, events, evictor = FakeApi(), FakeEvents(), FakeEvictor(outcome)
    registry = CollectorRegistry()
    compactor = Compactor(cache, owners, evictor, events, api,
                          settings=CompactSettings(min_pod_age_s=min_age, max_pods=2,
                                                   min_excess=1, evictions_per_hour=per_hour),
                          metrics=CompactMetrics(registry), memory=memory)
    lead = leader if leader is not None else [True]
    act = MigActuator(cache, api, is_leader=lambda: lead[0], clock=clock, params=FAST,
                      settings=MigSettings(config_propagation_s=0, settle_s=0), compactor=compactor)
    return cache, act, evictor, api, events, clock, registry


def drain_holds(cache: Any) -> set[str]:
    return {k for k in cache.holds() if k.startswith(DRAIN_PREFIX)}


def test_drain_holds_evicts_holds_the_freed_slice_and_ends_emptied() -> None:
    cache, act, evictor, api, events, clock, registry = setup()
    act.step()
    assert evictor.asked == ["default/lone"]
    assert drain_holds(cache) == {f"{DRAIN_PREFIX}a/0/{s}" for s in range(1, 7)}
    assert ("a", "MigDrainStarted", False) in api.events
    assert events.emitted == [("default/lone", "MigCompactionEvicted")]
    assert registry.get_sample_value("gpupack_mig_drains_total", {"result": "started"}) == 1
    assert registry.get_sample_value("gpupack_mig_compaction_evictions_total",
                                     {"outcome": "evicted"}) == 1
    # Still terminating on the next step: not evicted twice.
    clock.advance(1)
    act.step()
    assert evictor.asked == ["default/lone"]
    # The pod goes: its slice is held in the same step (before any pod is answered).
    cache.delete_pod("default/lone")
    assert f"{DRAIN_PREFIX}a/0/0" in drain_holds(cache)
    assert cache.state.gpu("a", 0).instances[0][1] == f"{DRAIN_PREFIX}a/0/0"
    clock.advance(1)
    act.step()
    assert drain_holds(cache) == set()
    assert ("a", "MigDrained", False) in api.events
    assert registry.get_sample_value("gpupack_mig_drains_total", {"result": "emptied"}) == 1
    assert registry.get_sample_value("gpupack_mig_drains_in_flight") == 0


def test_refused_eviction_ends_the_drain_and_cools_the_gpu_down() -> None:
    cache, act, evictor, api, _, clock, registry = setup(outcome="pdb")
    act.step()
    assert evictor.asked == ["default/lone"]
    clock.advance(1)
    act.step()
    assert drain_holds(cache) == set()
    assert ("a", "MigDrainStopped", True) in api.events
    assert registry.get_sample_value("gpupack_mig_drains_total", {"result": "refused"}) == 1
    clock.advance(60)
    act.step()
    assert evictor.asked == ["default/lone"]  # cooling down: not asked again


def test_a_pod_no_controller_recreates_is_not_moved() -> None:
    cache, act, evictor, _, _, _, _ = setup(lone_owned=False)
    act.step()
    assert evictor.asked == [] and drain_holds(cache) == set()


def test_a_standby_drains_nothing_and_a_lost_leadership_gives_the_holds_back() -> None:
    lead = [False]
    cache, act, evictor, _, _, clock, _ = setup(leader=lead)
    act.step()
    assert evictor.asked == [] and drain_holds(cache) == set()
    lead[0] = True
    act.step()
    assert drain_holds(cache)
    lead[0] = False
    clock.advance(1)
    act.step()
    assert drain_holds(cache) == set()


def test_a_slot_held_as_its_pod_went_during_a_step_stays_held() -> None:
    # The decision is taken on nodes gathered before the drained pod went; the hook held
    # its slot meanwhile. Applying that decision must not give the hold back (the slot
    # would be free for a pod until the next step).
    cache, act, evictor, _, _, clock, _ = setup()
    act.step()
    assert evictor.asked == ["default/lone"]
    clock.advance(1)
    state = act.gather(clock())
    cache.delete_pod("default/lone")
    assert f"{DRAIN_PREFIX}a/0/0" in drain_holds(cache)
    assert act.compactor is not None
    act.compactor.step(state, clock(), set())
    assert f"{DRAIN_PREFIX}a/0/0" in drain_holds(cache)
    assert cache.state.gpu("a", 0).instances[0][1] == f"{DRAIN_PREFIX}a/0/0"


class OnceRefused(FakeEvictor):
    """Refuses the first eviction (a PodDisruptionBudget), accepts the others."""

    def evict(self, ref: PodRef) -> EvictionResult:
        self.asked.append(ref.key)
        if len(self.asked) == 1:
            return EvictionResult("pdb", "budget")
        return EvictionResult("evicted")


def test_a_refusal_stops_the_drain_before_its_other_pods_are_evicted() -> None:
    two = [asr_on("x1", 0, 0), asr_on("x2", 0, 1)]
    cache, act, _, _, _, clock, _ = setup(on_gpu0=two)
    assert act.compactor is not None
    act.compactor.evictor = evictor = OnceRefused()
    act.step()
    assert evictor.asked == ["default/x1"]  # x2 is not restarted for nothing
    clock.advance(1)
    act.step()
    assert drain_holds(cache) == set() and act.compactor.drains == {}


def test_job_pods_are_not_moved() -> None:
    cache, act, evictor, _, _, _, _ = setup(on_gpu0=[asr_on("batch", 0, 0, kind="Job")])
    act.step()
    assert evictor.asked == [] and drain_holds(cache) == set()


def test_age_counts_per_pod_uid_not_per_name() -> None:
    # A StatefulSet's replacement keeps its pod's name: it starts young again.
    _, act, evictor, _, _, clock, _ = setup(
        on_gpu0=[asr_on("web-0", 0, 0, kind="StatefulSet", uid="u1")], min_age=300)
    owners = act.compactor.owners if act.compactor is not None else None
    assert isinstance(owners, PodOwners)
    act.step()
    clock.advance(200)
    owners.delete_pod("default/web-0")
    owners.upsert_pod(asr_on("web-0", 0, 0, kind="StatefulSet", uid="u2"))
    act.step()
    clock.advance(200)  # 400 s after the name was first seen, 200 s after this uid was
    act.step()
    assert evictor.asked == []
    clock.advance(150)
    act.step()
    assert evictor.asked == ["default/web-0"]


def started(p: dict[str, Any], at: float) -> dict[str, Any]:
    """``p`` with the kubelet's ``status.startTime`` at epoch second ``at``."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
    return {**p, "status": {**p["status"], "startTime": stamp}}


@pytest.mark.parametrize(("start", "moved_after"), [
    (600.0, 0),  # started 400 s before a new leader's first step: old enough already
    (900.0, 200),  # started 100 s before: 200 s more
    (1600.0, 300),  # a node clock ahead of the leader's: from when it was first seen
    (None, 300),  # the kubelet has not acknowledged it: from when it was first seen
])
def test_age_counts_from_the_kubelets_start_time(start: float | None,
                                                 moved_after: int) -> None:
    # A new leader (a fresh handler) knows how long a pod has run from its start time,
    # not only from when it first saw the pod (the clock reads 1000 at the first step).
    lone = asr_on("lone", 0, 0)
    _, act, evictor, _, _, clock, _ = setup(
        on_gpu0=[lone if start is None else started(lone, start)], min_age=300)
    waited = 0
    while True:
        act.step()
        if evictor.asked or waited > 400:
            break
        clock.advance(50)
        waited += 50
    assert evictor.asked == ["default/lone"] and waited == moved_after


def test_a_bind_confirmed_after_it_was_assumed_makes_its_pod_movable() -> None:
    # The confirmation of an assumed bind leaves the node's generation alone: the
    # compactor must not keep what it read while the bind was only assumed.
    cache, act, evictor, _, _, clock, _ = setup(on_gpu0=[])
    owners = act.compactor.owners if act.compactor is not None else None
    assert isinstance(owners, PodOwners)
    pending = pod("lone", {"nvidia.com/mig-1g.10gb": "1"}, uid="u-lone")
    pending["metadata"]["ownerReferences"] = OWNED
    owners.upsert_pod(pending)
    req = cache.pending_pod("default/lone")  # what the extender's bind assumes
    assert req is not None
    cache.assume(req, "u-lone", Placement("default/lone", "a", (0,), "1g.10gb", 0))
    act.step()
    assert evictor.asked == []  # only assumed: not moved
    owners.upsert_pod(asr_on("lone", 0, 0, uid="u-lone"))  # seen bound where assumed
    assert not cache.is_assumed("default/lone")
    clock.advance(1)
    act.step()
    assert evictor.asked == ["default/lone"]


class _RacingEvictor:
    """Evicting web-0 takes a while; meanwhile web-1 goes, and (``recreate``) its
    StatefulSet makes it again under its name, on GPU 1, with a new UID."""

    def __init__(self, owners: Any, recreate: bool) -> None:
        self.owners = owners
        self.recreate = recreate
        self.refs: list[PodRef] = []

    def evict(self, ref: PodRef) -> EvictionResult:
        self.refs.append(ref)
        if ref.key == "default/web-0":
            self.owners.delete_pod("default/web-1")
            if self.recreate:
                self.owners.upsert_pod(asr_on("web-1", 1, 5, kind="StatefulSet",
                                              uid="web1-new"))
        return EvictionResult("evicted")


@pytest.mark.parametrize("recreate", [True, False], ids=["recreated", "gone"])
def test_an_eviction_reaches_only_the_pod_still_on_the_drained_gpu(recreate: bool) -> None:
    # The UID was read again just before each eviction: the replacement (new UID, on
    # another GPU) was evicted, or, gone from the cache, the eviction went without a UID
    # precondition to whatever pod had the name by then.
    two = [asr_on("web-0", 0, 0, kind="StatefulSet", uid="web0-old"),
           asr_on("web-1", 0, 1, kind="StatefulSet", uid="web1-old")]
    _, act, _, _, _, _, _ = setup(on_gpu0=two)
    assert act.compactor is not None
    evictor = _RacingEvictor(act.compactor.owners, recreate)
    act.compactor.evictor = evictor
    act.step()
    assert [(r.key, r.uid) for r in evictor.refs] == [("default/web-0", "web0-old")]
    (drain,) = act.compactor.drains.values()
    assert drain.evicted == {"default/web-0", "default/web-1"}  # nothing left to evict
    assert len(act.compactor.evicted_at) == 1  # the budget counts the one eviction


def test_a_pod_gone_before_its_eviction_uses_no_budget_and_no_event() -> None:
    # 404 (or a 409 on the UID): nothing was evicted, yet it was counted in the hour's
    # budget and announced as evicted.
    _, act, evictor, _, events, _, registry = setup(outcome="gone")
    act.step()
    assert act.compactor is not None and evictor.asked == ["default/lone"]
    assert act.compactor.evicted_at == [] and events.emitted == []
    (drain,) = act.compactor.drains.values()
    assert drain.evicted == {"default/lone"} and drain.refused is None
    assert registry.get_sample_value("gpupack_mig_compaction_evictions_total",
                                     {"outcome": "gone"}) == 1


def test_an_event_that_fails_stops_neither_the_step_nor_the_next_eviction() -> None:
    two = [asr_on("web-0", 0, 0), asr_on("web-1", 0, 1)]
    _, act, evictor, _, events, _, _ = setup(on_gpu0=two)

    def broken(*a: Any, **k: Any) -> None:
        raise ValueError("an Event the client could not build")

    events.emit = broken  # type: ignore[method-assign]
    act.step()
    assert evictor.asked == ["default/web-0", "default/web-1"]
    assert act.compactor is not None and len(act.compactor.evicted_at) == 2
