"""packing.dra.offers: the devices a burst of one-device claims of a class gets on a node,
in one pass, equal to kube-scheduler's allocator (packing.dra.allocator.predict, itself
checked against kube-scheduler v1.37.2) run pod after pod."""

from __future__ import annotations

from typing import Any

import pytest
from dra_builders import ANY, NODE, device, q, slice_
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packing.dra import nvidia, served
from packing.dra.allocator import AllocatedState, Verdict, allocated_state, predict
from packing.dra.objects import (
    Allocation,
    DeviceClass,
    DeviceRequest,
    DeviceTaint,
    Node,
    Request,
    RequestPolicy,
    ResourceClaim,
    ValidRange,
)
from packing.dra.offers import SliceIndex, node_fits, sequential_fits
from packing.dra.parse import parse_device_class
from packing.dra.pools import gather_pools
from packing.dra.world import DraWorld, world_from_api

CLASSES = {c.name: c for c in map(parse_device_class,
                                   [*nvidia.device_classes(), *served.device_classes()])}


def _claim(klass: str, n: int) -> ResourceClaim:
    return ResourceClaim("ns", f"burst-{n}", requests=(
        DeviceRequest("r", exactly=Request("r", klass)),))


def _by_predict(world: DraWorld, node: Node, klass: str, limit: int
                ) -> tuple[list[str], Verdict]:
    """One claim after the other through the allocator model, each allocation then
    counted as held."""
    held: list[ResourceClaim] = list(world.claims.values())
    out: list[str] = []
    while len(out) < limit:
        p = predict(node, world.slices, world.classes, allocated_state(held),
                    [_claim(klass, len(out))])
        if p.verdict is not Verdict.ALLOCATED:
            return out, p.verdict
        out.append(p.devices[0][0])
        held.append(ResourceClaim("ns", f"held-{len(out)}", allocation=Allocation(p.results[0])))
    return out, Verdict.ALLOCATED


def _ids(world: DraWorld, node: Node, klass: str, limit: int) -> tuple[list[str], Verdict]:
    fits = node_fits(node, world.slices, world.classes[klass], world.allocated, limit=limit)
    return [did for did, _ in fits.devices], fits.stop


# --- table: what a burst gets ------------------------------------------------------------

def _h100_world(gpus: int = 2, model: str = "H100-80GB", **info: Any) -> DraWorld:
    slices = nvidia.node_slices("n1", [nvidia.GpuSpec(g, model) for g in range(gpus)],
                                info=nvidia.DriverInfo(**info))
    world, errors = world_from_api(slices, [*nvidia.device_classes(),
                                            *served.device_classes()], [])
    assert errors == []
    return world


@pytest.mark.parametrize(("klass", "count", "first", "last"), [
    # DynamicMIG, two H100s: 1g.10gb fills GPU 0's seven placements, then GPU 1's.
    ("gpupack-mig-1g.10gb", 14, "gpu-0-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-6"),
    ("gpupack-mig-3g.40gb", 4, "gpu-0-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"),
    ("gpupack-mig-7g.80gb", 2, "gpu-0-mig-7g80gb-0-0", "gpu-1-mig-7g80gb-0-0"),
    # One 1g.10gb+me per GPU: its OFA counter is 1.
    ("gpupack-mig-1g.10gb.me", 2, "gpu-0-mig-1g10gb-me-20-0", "gpu-1-mig-1g10gb-me-20-0"),
    (nvidia.GPU_CLASS, 2, "gpu-0", "gpu-1"),
    # Nothing shareable without the driver's ConsumableShares.
    ("gpupack-gpu-shared", 0, None, None),
])
def test_burst_on_dynamic_mig(klass: str, count: int, first: str | None,
                              last: str | None) -> None:
    world = _h100_world()
    fits = node_fits(Node("n1"), world.slices, world.classes[klass], world.allocated)
    names = [d.name for _, d in fits.devices]
    assert len(names) == count and fits.stop is Verdict.UNSCHEDULABLE
    if count:
        assert (names[0], names[-1]) == (first, last)
    assert _by_predict(world, Node("n1"), klass, 64)[0] == [did for did, _ in fits.devices]


@pytest.mark.parametrize(("model", "mode", "count"), [
    ("L40S", "4", 8),  # four shares per GPU
    ("L40S", "memory", 2),  # each share's default is the whole memory: one per GPU
    # The default consumes nothing: the first GPU takes every pod (the scan stops at 64).
    ("L40S", "unlimited", 64),
    # DynamicMIG: a whole GPU's other capacities (multiprocessors ...) have no request
    # policy, so its first share takes all of them and no second one fits.
    ("H100-80GB", "4", 2),
])
def test_shares_follow_the_request_policy_default(model: str, mode: str, count: int) -> None:
    world = _h100_world(model=model, consumable_shares=mode)
    fits = node_fits(Node("n1"), world.slices, world.classes["gpupack-gpu-shared"],
                     world.allocated)
    assert fits.count == count
    assert _by_predict(world, Node("n1"), "gpupack-gpu-shared", 64)[0] == [
        did for did, _ in fits.devices]


def test_held_devices_counters_and_taints_are_skipped() -> None:
    """gpu-0's 1g.10gb at slice 0 held, its 3g.40gb at 4 held (slices 4-7), gpu-1 tainted:
    a 1g.10gb burst gets gpu-0's slices 1-3 only."""
    slices = nvidia.node_slices("n1", [nvidia.GpuSpec(g, "H100-80GB") for g in range(2)],
                                info=nvidia.DriverInfo(taints={
                                    f"gpu-1-mig-1g10gb-19-{i}": [
                                        {"key": "k", "effect": "NoSchedule"}]
                                    for i in range(7)}))
    held = {"metadata": {"name": "held", "namespace": "ns"}, "spec": {"devices": {
        "requests": [{"name": "r", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": nvidia.DRIVER, "pool": "n1",
             "device": "gpu-0-mig-1g10gb-19-0"},
            {"request": "r", "driver": nvidia.DRIVER, "pool": "n1",
             "device": "gpu-0-mig-3g40gb-9-4"}]}}}}
    world, errors = world_from_api(slices, [*nvidia.device_classes(),
                                            *served.device_classes()], [held])
    assert errors == []
    got, stop = _ids(world, Node("n1"), "gpupack-mig-1g.10gb", 64)
    assert [g.rsplit("/", 1)[1] for g in got] == [f"gpu-0-mig-1g10gb-19-{i}" for i in (1, 2, 3)]
    assert stop is Verdict.UNSCHEDULABLE
    assert _by_predict(world, Node("n1"), "gpupack-mig-1g.10gb", 64) == (got, stop)


def test_a_cel_error_ends_the_burst_as_the_allocator_fails_the_pod() -> None:
    """A class reading an attribute one device lacks: the allocator fails the pod when its
    search reaches that device; the burst ends there with ``error``."""
    klass = DeviceClass("bad", ("device.attributes['test.example.com'].model == 'x'",))
    slices = [slice_("s", device("a", attrs={"model": "x"}), device("b"),
                     device("c", attrs={"model": "x"}))]
    fits = sequential_fits(NODE, gather_pools(NODE, slices), klass, AllocatedState())
    assert [d.name for _, d in fits.devices] == ["a"] and fits.stop is Verdict.ERROR
    assert "device test.example.com/pool/b" in fits.reason
    p = predict(NODE, slices, {"bad": klass}, allocated_state([
        ResourceClaim("ns", "h", allocation=Allocation(tuple(
            r for r in predict(NODE, slices, {"bad": klass}, AllocatedState(),
                               [_claim("bad", 0)]).results[0])))]), [_claim("bad", 1)])
    assert p.verdict is Verdict.ERROR


def test_unknown_cel_stops_with_unknown() -> None:
    klass = DeviceClass("odd", ("device.attributes['test.example.com'].model.matches('x')",))
    slices = [slice_("s", device("a", attrs={"model": "x"}))]
    fits = sequential_fits(NODE, gather_pools(NODE, slices), klass, AllocatedState())
    assert fits.count == 0 and fits.stop is Verdict.UNKNOWN


def test_limit() -> None:
    slices = [slice_("s", *(device(f"d{i}") for i in range(5)))]
    fits = sequential_fits(NODE, gather_pools(NODE, slices), ANY, AllocatedState(), limit=3)
    assert fits.count == 3 and fits.stop is Verdict.ALLOCATED


def test_a_negative_counter_blocks_every_consumer() -> None:
    """Allocated devices may over-consume a counter (the driver republished less): then
    nothing consuming any counter of the pool fits, as take_counters checks them all."""
    slices = [
        slice_("a-counters", counters={"set": {"x": 1, "y": 5}}, count=2),
        slice_("b-devices", device("big", counters={"set": {"x": 2}}),
               device("small", counters={"set": {"y": 1}}), device("free"), count=2)]
    state = allocated_state([ResourceClaim("ns", "h", allocation=Allocation((
        _result("big"),)))])
    fits = sequential_fits(NODE, gather_pools(NODE, slices), ANY, state)
    assert [d.name for _, d in fits.devices] == ["free"]


def _result(name: str) -> Any:
    from packing.dra.objects import AllocatedDevice

    return AllocatedDevice("r", "test.example.com", "pool", name)


def test_shared_device_pays_counters_once() -> None:
    policy = {"memory": RequestPolicy(default=q("10Gi"), valid_range=ValidRange(q("1Mi")))}
    slices = [
        slice_("a-counters", counters={"set": {"x": 1}}, count=2),
        slice_("b-devices",
               device("s", capacity={"memory": "30Gi"}, multi=True, policy=policy,
                      counters={"set": {"x": 1}}),
               device("t", counters={"set": {"x": 1}}), count=2)]
    fits = sequential_fits(NODE, gather_pools(NODE, slices), ANY, AllocatedState())
    assert [d.name for _, d in fits.devices] == ["s", "s", "s"]


def test_slice_index_gives_what_gather_pools_needs() -> None:
    slices = [
        slice_("n1-a", device("a"), pool="p1", node="n1"),
        slice_("n2-a", device("b"), pool="p2", node="n2"),
        # one pool over two nodes: each node sees its slice, completeness counts both
        slice_("shared-1", device("c"), pool="wide", node="n1", count=2),
        slice_("shared-2", device("d"), pool="wide", node="n2", count=2),
        slice_("everywhere", device("e"), pool="all", node=None, all_nodes=True)]
    index = SliceIndex(slices)
    assert set(index.nodes) == {"n1", "n2"}
    for name in ("n1", "n2"):
        node = Node(name)
        assert gather_pools(node, index.node_slices(name)) == gather_pools(node, slices)


# --- property: one pass == the allocator pod after pod -----------------------------------

_MODELS = ("H100-80GB", "A100-40GB", "L40S")


@st.composite
def _worlds(draw: st.DrawFn) -> tuple[DraWorld, str]:
    gpus = []
    for minor in range(draw(st.integers(1, 3))):
        model = draw(st.sampled_from(_MODELS))
        mig_mode = model != "L40S" and draw(st.booleans())
        gpus.append(nvidia.GpuSpec(minor, model, mig_mode=mig_mode))
    layout = draw(st.sampled_from(list(nvidia.Layout)))
    if layout is nvidia.Layout.STATIC:
        gpus = [g if not g.mig_mode else nvidia.GpuSpec(
            g.minor, g.model, mig_mode=True,
            static_mig=(("1g.10gb" if g.model == "H100-80GB" else "1g.5gb", 0),
                        ("3g.40gb" if g.model == "H100-80GB" else "3g.20gb", 4)))
            for g in gpus]
    shares = draw(st.sampled_from(["", "2", "memory", "unlimited"]))
    slices = nvidia.node_slices("n1", gpus, layout=layout,
                                info=nvidia.DriverInfo(consumable_shares=shares))
    world, errors = world_from_api(slices, [*nvidia.device_classes(),
                                            *served.device_classes()], [])
    assert errors == []
    # Some claims already allocated, each where the allocator would have put it.
    held: list[ResourceClaim] = []
    names = sorted(world.classes)
    for i in range(draw(st.integers(0, 6))):
        klass = draw(st.sampled_from(names))
        p = predict(Node("n1"), world.slices, world.classes, allocated_state(held),
                    [_claim(klass, i)])
        if p.verdict is Verdict.ALLOCATED:
            held.append(ResourceClaim("ns", f"pre-{i}", allocation=Allocation(p.results[0])))
    world = DraWorld(world.slices, world.classes, allocated_state(held),
                     {c.key: c for c in held})
    return world, draw(st.sampled_from(names))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_worlds())
def test_one_pass_equals_the_allocator_pod_after_pod(case: tuple[DraWorld, str]) -> None:
    world, klass = case
    assert _ids(world, Node("n1"), klass, 40) == _by_predict(world, Node("n1"), klass, 40)


def test_taint_rule_taints_are_honoured() -> None:
    slices = [slice_("s", device("a", taints=[DeviceTaint("k", "v", "NoExecute")]),
                     device("b", taints=[DeviceTaint("k", "v", "PreferNoSchedule")]))]
    fits = sequential_fits(NODE, gather_pools(NODE, slices), ANY, AllocatedState())
    assert [d.name for _, d in fits.devices] == ["b"]
