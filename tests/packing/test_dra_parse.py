"""packing.dra.parse: the API's JSON to the model's values, the defaults the API server
applies, and errors that name the object, the field and the value."""

from __future__ import annotations

import contextlib
import copy
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.dra import nvidia
from packing.dra.objects import AllocationMode, Semver
from packing.dra.parse import (
    DraParseError,
    parse_claim_template,
    parse_device_class,
    parse_device_taint_rule,
    parse_node,
    parse_resource_claim,
    parse_resource_slice,
)


def slice_json(**spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"driver": "d.example.com", "nodeName": "n1",
                            "pool": {"name": "n1", "generation": 2, "resourceSliceCount": 1},
                            "devices": [{"name": "dev-0"}]}
    base.update(spec)
    return {"metadata": {"name": "s1"}, "spec": base}


def claim_json(requests: list[Any], **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "c1", "namespace": "ns", "uid": "u1"},
            "spec": {"devices": {"requests": requests, **extra}}}


def test_slice_fields() -> None:
    s = parse_resource_slice(slice_json(devices=[{
        "name": "gpu-0",
        "attributes": {"type": {"string": "gpu"}, "index": {"int": 0},
                       "ok": {"bool": True}, "v": {"version": "1.2.3-rc.1"},
                       "numas": {"ints": [0, 1]}},
        "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
            "default": "1Gi", "validRange": {"min": "1Mi", "max": "80Gi", "step": "1Mi"}}}},
        "consumesCounters": [{"counterSet": "cs", "counters": {"mem": {"value": "8"}}}],
        "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}],
        "allowMultipleAllocations": True}]))
    d = s.devices[0]
    assert (s.driver, s.pool, s.generation, s.resource_slice_count) == ("d.example.com", "n1",
                                                                        2, 1)
    assert d.attributes == {"type": "gpu", "index": 0, "ok": True,
                            "v": Semver(1, 2, 3, ("rc", 1)), "numas": (0, 1)}
    mem = d.capacity["memory"]
    assert mem.value == Decimal(80 * 2**30)
    assert mem.request_policy is not None and mem.request_policy.valid_range is not None
    assert mem.request_policy.valid_range.step == Decimal(2**20)
    assert d.consumes_counters[0].counters == {"mem": Decimal(8)}
    assert d.taints[0].effect == "NoSchedule" and d.allow_multiple_allocations is True


def test_claim_defaults_and_shapes() -> None:
    c = parse_resource_claim(claim_json(
        [{"name": "a", "exactly": {"deviceClassName": "gpu"}},
         {"name": "b", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}},
         {"name": "c", "firstAvailable": [{"name": "s1", "deviceClassName": "mig",
                                           "tolerations": [{"key": "k"}]}]}],
        constraints=[{"requests": ["a", "c/s1"], "matchAttribute": "d/x"}]) | {
        "status": {"allocation": {"devices": {"results": [
            {"request": "a", "driver": "d", "pool": "p", "device": "x", "shareID": "s",
             "consumedCapacity": {"memory": "1Gi"}}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}]}})
    a, b, cc = c.requests
    assert a.exactly is not None and (a.exactly.allocation_mode, a.exactly.count) == (
        AllocationMode.EXACT_COUNT, 1)
    assert b.exactly is not None and b.exactly.allocation_mode == AllocationMode.ALL
    assert cc.first_available[0].tolerations[0].operator == "Equal"
    assert c.constraints[0].match_attribute == "d/x"
    assert c.allocation is not None and c.allocation.results[0].share_id == "s"
    assert c.reserved_for == ("pod-uid",) and c.key == "ns/c1"


def test_template_class_rule_node() -> None:
    t = parse_claim_template({"metadata": {"name": "t", "namespace": "ns"}, "spec": {
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {
            "deviceClassName": "gpu", "count": 2}}]}}}})
    assert t.requests[0].exactly is not None and t.requests[0].exactly.count == 2
    classes = [parse_device_class(c) for c in nvidia.device_classes()]
    assert [(c.name, c.extended_resource_name) for c in classes] == [
        ("gpu.nvidia.com", "nvidia.com/gpu"), ("mig.nvidia.com", None)]
    rule = parse_device_taint_rule({"metadata": {"name": "r"}, "spec": {
        "deviceSelector": {"pool": "n1"}, "taint": {"key": "k", "effect": "NoExecute"}}})
    assert rule.selects("any", "n1", "gpu-0") and not rule.selects("any", "n2", "gpu-0")
    no_selector = parse_device_taint_rule({"metadata": {"name": "r"}, "spec": {
        "taint": {"key": "k", "effect": "NoExecute"}}})
    assert not no_selector.selects("any", "n1", "gpu-0")
    assert parse_node({"metadata": {"name": "n", "labels": {"a": "b"}}}).labels == {"a": "b"}


@pytest.mark.parametrize(("obj", "words"), [
    (slice_json(devices=[{"name": "d", "capacity": {"memory": {"value": "12X"}}}]),
     ["ResourceSlice s1", "spec.devices[0].capacity.memory.value", "'12X'"]),
    (slice_json(devices=[{"name": "d", "attributes": {"a": {"int": 1, "string": "x"}}}]),
     ["spec.devices[0].attributes.a", "exactly one"]),
    (slice_json(devices=[{"name": "d", "attributes": {"v": {"version": "v1.2"}}}]),
     ["spec.devices[0].attributes.v.version", "'v1.2'", "semantic version"]),
    (slice_json(pool={"name": "p", "generation": 1, "resourceSliceCount": 0}),
     ["spec.pool.resourceSliceCount", "0"]),
    (slice_json(nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "k", "operator": "Near"}]}]}),
     ["spec.nodeSelector.nodeSelectorTerms[0].matchExpressions[0].operator", "'Near'"]),
    ({"metadata": {}, "spec": {}}, ["ResourceSlice", "metadata.name"]),
    ("not an object", ["ResourceSlice", "not an object"]),
])
def test_slice_errors_name_the_field(obj: Any, words: list[str]) -> None:
    with pytest.raises(DraParseError) as e:
        parse_resource_slice(obj)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize(("requests", "words"), [
    ([{"name": "a"}], ["spec.devices.requests[0]", "exactly one of exactly and firstAvailable"]),
    ([{"name": "a", "exactly": {"deviceClassName": "g", "count": 0}}],
     ["spec.devices.requests[0].exactly.count", "0"]),
    ([{"name": "a", "exactly": {"deviceClassName": "g", "allocationMode": "Most"}}],
     ["allocationMode", "'Most'"]),
    ([{"name": "a", "exactly": {"deviceClassName": "g", "selectors": [{}]}}],
     ["selectors[0]", "no cel selector"]),
    ([{"name": "a", "exactly": {"deviceClassName": "g", "capacity": {
        "requests": {"memory": "lots"}}}}], ["capacity.requests.memory", "'lots'"]),
    ([{"name": "a", "exactly": {"deviceClassName": "g", "tolerations": [
        {"operator": "Near"}]}}], ["tolerations[0].operator", "'Near'"]),
])
def test_claim_errors_name_the_field(requests: list[Any], words: list[str]) -> None:
    with pytest.raises(DraParseError) as e:
        parse_resource_claim(claim_json(requests))
    assert "ResourceClaim ns/c1" in str(e.value)
    for w in words:
        assert w in str(e.value)


_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(
    ["", "x", "12X", "-1", "v1", "1Gi"]), st.just([]), st.just({}), st.just([{}]))
_VALID = [
    (parse_resource_slice, nvidia.node_slices("n1", [nvidia.GpuSpec(0, "H100-80GB")])[1]),
    (parse_resource_slice, nvidia.node_slices("n1", [nvidia.GpuSpec(0, "H100-80GB")])[0]),
    (parse_resource_claim, claim_json(
        [{"name": "a", "exactly": {"deviceClassName": "g", "count": 2, "selectors": [
            {"cel": {"expression": "true"}}], "capacity": {"requests": {"memory": "1Gi"}},
            "tolerations": [{"key": "k", "operator": "Exists"}]}},
         {"name": "b", "firstAvailable": [{"name": "s", "deviceClassName": "g"}]}],
        constraints=[{"matchAttribute": "d/x"}]) | {"status": {"allocation": {
            "devices": {"results": [{"request": "a", "driver": "d", "pool": "p",
                                     "device": "x"}]}}}}),
]


@settings(max_examples=300)
@given(st.sampled_from(range(len(_VALID))), st.data())
def test_any_broken_field_parses_or_names_itself(which: int, data: st.DataObject) -> None:
    """A valid object with one field (at any depth) replaced by junk: it still parses,
    or fails with a DraParseError, never anything else."""
    parse, valid = _VALID[which]
    obj = copy.deepcopy(valid)
    node: Any = obj
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if isinstance(child, dict | list) and child and data.draw(st.booleans()):
            node = child
            continue
        node[key] = data.draw(_JUNK)
        break
    with contextlib.suppress(DraParseError):
        parse(obj)
