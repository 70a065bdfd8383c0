"""MIG compaction's handler (scheduler/mig_compact_act.py) inside the actuator's step, on a
real cache with a fake Eviction API: drains start on the leader only, the drained GPU's
free instances are held before the eviction, the evicted pod's slice is held the moment
it goes, an emptied drain gives everything back, a refused eviction ends the drain and
cools the GPU down, a standby holds nothing; Events and metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry
from sched_builders import FakeClock, make_cache, node, pod
from test_mig_loop import FAST, FakeApi

from kube.annotations import placement_annotations
from kube.defrag_inputs import PodOwners
from kube.evictions import EvictionResult, PodRef
from packing.model import Placement
from scheduler.mig_actuator import MigSettings
from scheduler.mig_compact import DRAIN_PREFIX, CompactSettings
from scheduler.mig_compact_act import CompactMetrics, Compactor
from scheduler.mig_loop import MigActuator

OWNED = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "asr", "uid": "rs-1",
          "controller": True}]


def asr_on(name: str, gpu: int, start: int, owned: bool = True) -> dict[str, Any]:
    key = f"default/{name}"
    p = pod(name, {"nvidia.com/mig-1g.10gb": "1"}, node="a",
            annotations=placement_annotations(
                Placement(key, "a", (gpu,), "1g.10gb", start), "gpupack"))
    if owned:
        p["metadata"]["ownerReferences"] = OWNED
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


def setup(outcome: str = "evicted", leader: list[bool] | None = None, lone_owned: bool = True
          ) -> tuple[Any, MigActuator, FakeEvictor, FakeApi, FakeEvents, FakeClock,
                     CollectorRegistry]:
    # GPU 0 holds one ASR pod; GPU 1 holds three and has four free 1g slices.
    pods = [asr_on("lone", 0, 0, lone_owned)] + [asr_on(f"p{i}", 1, i) for i in range(3)]
    cache = make_cache([node("a", gpus=2, mig={"1g.10gb": 14})], [])
    owners = PodOwners(cache)
    owners.replace(None, pods)
    clock = FakeClock()
    api, events, evictor = FakeApi(), FakeEvents(), FakeEvictor(outcome)
    registry = CollectorRegistry()
    compactor = Compactor(cache, owners, evictor, events, api,
                          settings=CompactSettings(min_pod_age_s=0, max_pods=2, min_excess=1),
                          metrics=CompactMetrics(registry))
    lead = leader if leader is not None else [True]
    act = MigActuator(cache, api, is_leader=lambda: lead[0], clock=clock, params=FAST,
                      settings=MigSettings(settle_s=0), compactor=compactor)
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
