"""MIG compaction on a DynamicMIG (DRA) node, on a real cache with DRA objects: the
tenants of a partitionable GPU are its claims' owner pods, the drained GPU is fenced by
DeviceTaintRules before any eviction (no fence writer: no drain; a failed write: no
eviction until it is up; none until it has stood FENCE_SETTLE_S), the pod and not its
claim is evicted, and the MIG actuator never asks the MIG manager to change the node.
Plus the fences' own plan."""

from __future__ import annotations

from typing import Any

import pytest
from builders_dra import claim, claim_pod, dra_node, h100_slices, result
from prometheus_client import CollectorRegistry
from sched_builders import FakeClock
from test_mig_compact_act import FakeEvents, FakeEvictor
from test_mig_loop import FAST, FakeApi

from kube.cache import ClusterCache
from kube.defrag.inputs import PodOwners
from kube.dra_store import CLAIMS, CLASSES, SLICES
from kube.mig.fences import TAINT_KEY, plan, rule_name, rule_object
from packing.dra import nvidia
from scheduler.mig.compact.decide import FENCE_SETTLE_S, CompactSettings
from scheduler.mig.compact.loop import CompactMetrics, Compactor
from scheduler.mig.decide import MigSettings
from scheduler.mig.loop import MigActuator

MIG_1G = f"device.attributes['{nvidia.DRIVER}'].profile == '1g.10gb'"
RS = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "asr", "uid": "rs-1",
      "controller": True}


class FakeFences:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.synced: list[list[str]] = []

    def sync(self, devices: Any) -> str | None:
        if self.fail:
            return "DeviceTaintRules not written: 403 Forbidden"
        self.synced.append(sorted(devices))
        return None


def asr(name: str, gpu: int, start: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod on node a and the claim made for it, allocated a 1g.10gb at ``start``."""
    c = claim(f"{name}-gpu", klass=nvidia.MIG_CLASS, selectors=[MIG_1G], owner_pod=name,
              reserved_for=[name], results=[result("a", f"gpu-{gpu}-mig-1g10gb-19-{start}")])
    p = claim_pod(name, claims=[f"{name}-gpu"], node="a")
    p["metadata"]["ownerReferences"] = [RS]
    return p, c


def setup(fences: FakeFences | None, made: list[tuple[dict[str, Any], dict[str, Any]]]
          | None = None, settings: CompactSettings | None = None
          ) -> tuple[ClusterCache, MigActuator, FakeEvictor, FakeApi]:
    """Node a of two H100s and the pods and claims ``made`` (default: GPU 0 holds one
    ASR pod's instance; GPU 1 four); compaction's ``settings`` (default: drains of up to
    two pods of any age)."""
    if made is None:
        made = [asr("lone", 0, 0)] + [asr(f"p{i}", 1, i) for i in range(4)]
    cache = ClusterCache("gpupack", mig_actuator=True)
    cache.replace([dra_node("a", labels={"gpupack.io/mig-reconfigure": "true"})],
                  [p for p, _ in made])
    cache.replace_dra(SLICES, h100_slices("a", 2))
    cache.replace_dra(CLASSES, nvidia.device_classes())
    cache.replace_dra(CLAIMS, [c for _, c in made])
    cache.mark_synced()
    owners = PodOwners(cache)
    owners.replace(None, [p for p, _ in made])
    api, evictor = FakeApi(), FakeEvictor()
    compactor = Compactor(cache, owners, evictor, FakeEvents(), api,
                          settings=settings or CompactSettings(min_pod_age_s=0, max_pods=2,
                                                               min_excess=1),
                          metrics=CompactMetrics(CollectorRegistry()), fences=fences)
    act = MigActuator(cache, api, is_leader=lambda: True, clock=FakeClock(), params=FAST,
                      settings=MigSettings(config_propagation_s=0, settle_s=0),
                      compactor=compactor)
    return cache, act, evictor, api


def gpu0_devices(cache: ClusterCache) -> list[str]:
    inv = cache.dra_inventory("a")
    assert inv is not None
    return sorted(d for d, dev in inv.devices.items() if dev.gpu == 0)


def test_the_lone_pod_is_evicted_behind_a_fence_of_its_gpu() -> None:
    fences = FakeFences()
    cache, act, evictor, api = setup(fences)
    act.step()
    devices = gpu0_devices(cache)
    assert len(devices) == 26  # whole GPU and every placement of every profile
    assert fences.synced == [devices]
    # Not in the step that wrote the fence: kube-scheduler sees it through a watch.
    assert evictor.asked == []
    act.clock.advance(FENCE_SETTLE_S - 0.1)
    act.step()
    assert evictor.asked == []
    act.clock.advance(0.1)
    act.step()
    assert fences.synced == [devices] * 3
    assert evictor.asked == ["default/lone"]  # the pod, not its claim
    assert ("a", "MigDrainStarted", False) in api.events
    assert api.labels == []  # the MIG manager is never asked to touch a DRA node


def test_no_eviction_until_the_fence_is_up() -> None:
    fences = FakeFences(fail=True)
    _, act, evictor, _ = setup(fences)
    act.step()
    assert evictor.asked == []
    fences.fail = False
    act.step()
    assert evictor.asked == []  # up now; the wait starts here
    act.clock.advance(FENCE_SETTLE_S)
    fences.fail = True
    act.step()
    assert evictor.asked == []  # a failed write: not known to be up, starts again
    fences.fail = False
    act.step()
    act.clock.advance(FENCE_SETTLE_S)
    act.step()
    assert evictor.asked == ["default/lone"]


def test_without_a_fence_writer_a_dynamic_gpu_is_not_drained() -> None:
    _, act, evictor, api = setup(None)
    act.step()
    assert evictor.asked == [] and not any(e[1] == "MigDrainStarted" for e in api.events)


def test_fence_plan_and_rule() -> None:
    a, b = "gpu.nvidia.com/n1/gpu-0", "gpu.nvidia.com/n1/gpu-0-mig-1g10gb-19-0"
    create, delete = plan([a, b], [rule_name(a), "gpupack-drain-stale"])
    assert create == [b] and delete == ["gpupack-drain-stale"]
    r = rule_object(b)
    assert r["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "n1",
                                           "device": "gpu-0-mig-1g10gb-19-0"}
    assert r["spec"]["taint"] == {"key": TAINT_KEY, "effect": "NoSchedule"}
    assert len(rule_name("x" * 500)) <= 63


def steer_setup(on_gpu1: int) -> tuple[ClusterCache, MigActuator, FakeFences, FakeEvictor]:
    """GPU 0 idle, GPU 1 holding ``on_gpu1`` ASR instances (pods of a ReplicaSet, too
    many to drain: ``max_pods`` 2)."""
    fences = FakeFences()
    cache, act, evictor, _ = setup(fences, [asr(f"p{i}", 1, i) for i in range(on_gpu1)])
    return cache, act, fences, evictor


def test_steering_fences_the_idle_gpus_mig_devices_in_the_same_pass() -> None:
    cache, act, fences, evictor = steer_setup(4)
    act.step()
    inv = cache.dra_inventory("a")
    assert inv is not None
    ones = sorted(d for d, dev in inv.devices.items()
                  if dev.gpu == 0 and dev.profile == "1g.10gb")
    assert len(ones) == 7
    got = fences.synced[-1]
    assert set(ones) <= set(got)
    profiles = {inv.devices[d].profile for d in got}
    # GPU 1 (1g at 0-3) has room for 1g, 1g.20gb, 2g, 3g at 4 and the +me; not 4g or 7g.
    assert profiles == {"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb"}, profiles
    assert all(inv.devices[d].gpu == 0 for d in got)  # never the GPU in use
    assert evictor.asked == []


def test_a_full_gpu_in_mig_mode_steers_nothing() -> None:
    _, act, fences, _ = steer_setup(7)
    act.step()
    assert fences.synced[-1:] in ([], [[]])


def _value(metric: Any, change: str | None = None) -> float:
    """A gauge's value, or a counter's total for ``change``, read as a scrape would."""
    samples = [x for m in metric.collect() for x in m.samples
               if not x.name.endswith("_created")
               and (change is None or x.labels.get("change") == change)]
    assert len(samples) == 1, samples
    return float(samples[0].value)


def test_steering_reports_its_changes_once_each() -> None:
    # Fenced at the first step (one MigSteered Event, the gauge counts the pairs), the
    # same fences again at the second (no new Event), lifted once GPU 1 is full.
    made = [asr(f"p{i}", 1, i) for i in range(4)]
    fences = FakeFences()
    cache, act, _, api = setup(fences, made)
    compactor = act.compactor
    assert compactor is not None and compactor.metrics is not None
    metrics = compactor.metrics
    act.step()
    steered = [e for e in api.events if e[1] == "MigSteered"]
    assert steered == [("a", "MigSteered", False)]
    pairs = len(compactor.steered)
    assert pairs == 5 and {g for _, g, _ in compactor.steered} == {0}
    assert _value(metrics.steered) == pairs
    assert _value(metrics.steer_changes, "fenced") == pairs
    act.step()
    assert [e for e in api.events if e[1] == "MigSteered"] == steered
    full = made + [asr(f"q{i}", 1, 4 + i) for i in range(3)]
    cache.replace([dra_node("a", labels={"gpupack.io/mig-reconfigure": "true"})],
                  [p for p, _ in full])
    cache.replace_dra(CLAIMS, [c for _, c in full])
    act.step()
    assert [e for e in api.events if e[1] == "MigSteerLifted"] == [
        ("a", "MigSteerLifted", False)]
    assert compactor.steered == set() and _value(metrics.steered) == 0
    assert _value(metrics.steer_changes, "lifted") == pairs
    assert fences.synced[-1] == []


def test_a_failed_fence_write_reports_no_steering() -> None:
    fences = FakeFences(fail=True)
    _, act, _, api = setup(fences, [asr(f"p{i}", 1, i) for i in range(4)])
    act.step()
    assert act.compactor is not None and act.compactor.steered == set()
    assert not any(e[1] == "MigSteered" for e in api.events)


def _refill(cache: ClusterCache, made: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    cache.replace([dra_node("a", labels={"gpupack.io/mig-reconfigure": "true"})],
                  [p for p, _ in made])
    cache.replace_dra(CLAIMS, [c for _, c in made])


@pytest.mark.parametrize(("keep", "kept"), [(1, True), (0, False)])
def test_the_compactor_keeps_its_fences_up_down_to_the_keep(keep: int, kept: bool) -> None:
    # Margin 2: with 1g.10gb at 0-3 on GPU 1, the profiles with room for two more go up
    # (1g.10gb: 4, 5, 6; 1g.20gb: 4, 6). Two more pods leave room for one of each: with
    # keep 1 the compactor, told what it put up, keeps them; with keep 0 (the margin)
    # they lift. Seven pods: no room, lifted either way.
    made = [asr(f"p{i}", 1, i) for i in range(4)]
    fences = FakeFences()
    settings = CompactSettings(min_pod_age_s=0, max_pods=2, min_excess=1,
                               dynamic_steer_margin=2, dynamic_steer_keep=keep)
    cache, act, _, _ = setup(fences, made, settings)
    compactor = act.compactor
    assert compactor is not None
    act.step()
    first = {p for _, _, p in compactor.steered}
    assert first == {"1g.10gb", "1g.20gb"}
    made += [asr(f"q{i}", 1, 4 + i) for i in range(2)]
    _refill(cache, made)
    act.step()
    assert ({p for _, _, p in compactor.steered} == first) is kept
    assert (fences.synced[-1] != []) is kept
    _refill(cache, [*made, asr("r", 1, 6)])
    act.step()
    assert compactor.steered == set() and fences.synced[-1] == []
