"""Extender v1 wire types: tolerant decoding, capitalized encoding, errors naming fields."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.extender.wire import (
    BindingArgs,
    ExtenderArgs,
    FilterResult,
    HostPriority,
    MetaVictims,
    PreemptionArgs,
    PreemptionResult,
    WireError,
    encode_priorities,
)

POD = {"metadata": {"name": "asr-0", "namespace": "speech", "uid": "u1"},
       "spec": {"containers": [{"name": "c", "image": "img"}]}}
NODE = {"metadata": {"name": "gpu-a"}, "status": {}}


@pytest.mark.parametrize("body", [
    {"Pod": POD, "Nodes": None, "NodeNames": ["gpu-a", "gpu-b"]},
    {"pod": POD, "nodes": None, "nodenames": ["gpu-a", "gpu-b"]},
    {"pod": POD, "nodeNames": ["gpu-a", "gpu-b"]},
])
def test_extender_args_names_in_any_case(body: dict[str, Any]) -> None:
    args = ExtenderArgs.decode(body)
    assert args.node_cache_capable
    assert args.candidate_names == ("gpu-a", "gpu-b")
    assert args.pod["metadata"]["name"] == "asr-0"


def test_extender_args_full_nodes() -> None:
    args = ExtenderArgs.decode({"Pod": POD, "Nodes": {"items": [NODE]}, "NodeNames": None})
    assert not args.node_cache_capable
    assert args.candidate_names == ("gpu-a",)


@pytest.mark.parametrize(("body", "message"), [
    ([], "ExtenderArgs: expected a JSON object"),
    ({"Nodes": None, "NodeNames": []}, "ExtenderArgs.Pod: missing"),
    ({"Pod": "x", "NodeNames": []}, "ExtenderArgs.Pod: expected a v1.Pod object, got 'x'"),
    ({"Pod": {"metadata": {}}, "NodeNames": []}, "ExtenderArgs.Pod.metadata.name: missing"),
    ({"Pod": POD}, "neither Nodes nor NodeNames"),
    ({"Pod": POD, "NodeNames": "gpu-a"}, "ExtenderArgs.NodeNames: expected a list"),
    ({"Pod": POD, "NodeNames": ["a", 3]}, "ExtenderArgs.NodeNames[1]: expected a node name, got 3"),
    ({"Pod": POD, "Nodes": {"items": [{}]}}, "ExtenderArgs.Nodes.items[0].metadata.name: missing"),
    ({"Pod": POD, "Nodes": {"items": 5}}, "ExtenderArgs.Nodes.items: expected a list"),
])
def test_extender_args_errors_name_the_field(body: Any, message: str) -> None:
    with pytest.raises(WireError) as e:
        ExtenderArgs.decode(body)
    assert message in str(e.value)


def test_binding_args() -> None:
    b = BindingArgs.decode({"PodName": "asr-0", "PodNamespace": "speech", "PodUID": "u1",
                            "Node": "gpu-a"})
    assert (b.pod_key, b.pod_uid, b.node) == ("speech/asr-0", "u1", "gpu-a")
    assert BindingArgs.decode({"podname": "p", "node": "n"}).pod_key == "default/p"
    with pytest.raises(WireError, match=r"ExtenderBindingArgs.Node: missing"):
        BindingArgs.decode({"PodName": "p"})
    with pytest.raises(WireError, match=r"ExtenderBindingArgs.PodName: expected a string, got 7"):
        BindingArgs.decode({"PodName": 7, "Node": "n"})


def test_preemption_args_meta_and_full() -> None:
    meta = PreemptionArgs.decode({"Pod": POD, "NodeNameToMetaVictims": {
        "gpu-a": {"Pods": [{"UID": "v1"}, {"uid": "v2"}], "NumPDBViolations": 1}}})
    assert meta.meta and meta.victims["gpu-a"].uids == ("v1", "v2")
    assert meta.victims["gpu-a"].num_pdb_violations == 1
    full = PreemptionArgs.decode({"pod": POD, "nodeNameToVictims": {
        "gpu-a": {"pods": [{"metadata": {"name": "v", "uid": "v9"}}]}}})
    assert not full.meta and full.victims["gpu-a"].uids == ("v9",)
    with pytest.raises(WireError, match=r"gpu-a.Pods\[0\].UID"):
        PreemptionArgs.decode({"Pod": POD, "NodeNameToMetaVictims": {"gpu-a": {"Pods": [{}]}}})
    with pytest.raises(WireError, match=r"NumPDBViolations: expected an integer"):
        PreemptionArgs.decode({"Pod": POD, "NodeNameToMetaVictims": {
            "gpu-a": {"Pods": [], "NumPDBViolations": "x"}}})


def test_encoding_uses_go_field_names() -> None:
    assert FilterResult(node_names=("gpu-a",), unresolvable={"gpu-b": "no"}).encode() == {
        "Nodes": None, "NodeNames": ["gpu-a"], "FailedNodes": {},
        "FailedAndUnresolvableNodes": {"gpu-b": "no"}, "Error": ""}
    assert encode_priorities([HostPriority("gpu-a", 8)]) == [{"Host": "gpu-a", "Score": 8}]
    assert PreemptionResult({"gpu-a": MetaVictims(("u",), 0)}).encode() == {
        "NodeNameToMetaVictims": {"gpu-a": {"Pods": [{"UID": "u"}], "NumPDBViolations": 0}}}
