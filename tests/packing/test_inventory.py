"""The gpupack.io/inventory codec: round trips, Hypothesis property, bad inputs, and
the change test that decides when the agent patches."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.inventory import (
    MAX_GPU_MIB,
    GpuInventory,
    Inventory,
    InventoryError,
    PodGpuUsage,
    decode_inventory,
    encode_inventory,
    meaningfully_changed,
)
from packing.model import GpuMode, MigInstance


def example() -> Inventory:
    return Inventory(
        node="gpu-node-1", ts=1_700_000_000,
        gpus=(
            GpuInventory(0, "GPU-5b8d0e1c", "NVIDIA-H100-80GB-HBM3", 81559, 38912, GpuMode.MIG,
                         mig=(MigInstance("2g.20gb", 0), MigInstance("1g.10gb", 2, "asr/w-1"),
                              MigInstance("1g.10gb", 3), MigInstance("3g.40gb", 4, "llm/v-0")),
                         pods=(PodGpuUsage("asr/w-1", 6144, 6200),
                               PodGpuUsage("llm/v-0", 30720, 30720))),
            GpuInventory(1, "GPU-0c7e2a91", "NVIDIA-L40S", 46068, 25600, GpuMode.SHARED,
                         pods=(PodGpuUsage("tts/a", 8192, 9000),)),
            GpuInventory(2, "GPU-9e1f4c72", "NVIDIA-L40S", 46068, 0, GpuMode.WHOLE),
        ),
        errors=("gpu 3: nvmlDeviceGetUUID: GpuIsLost",),
    )


def test_round_trip_and_wire_shape() -> None:
    inv = example()
    text = encode_inventory(inv)
    assert " " not in text.replace("gpu 3: nvmlDeviceGetUUID: GpuIsLost", "")
    assert decode_inventory(text) == inv
    wire = json.loads(text)
    assert wire["v"] == 1 and wire["node"] == "gpu-node-1"
    assert wire["gpus"][0]["mig"][1] == {"p": "1g.10gb", "s": 2, "owner": "asr/w-1"}
    assert wire["gpus"][0]["mig"][0]["owner"] is None
    assert wire["gpus"][1]["pods"] == [{"pod": "tts/a", "used": 8192, "peak": 9000}]
    assert wire["gpus"][2]["mode"] == "whole" and wire["err"] == list(inv.errors)


def test_unknown_keys_and_missing_lists_are_tolerated() -> None:
    wire = {"v": 1, "node": "n", "ts": 0, "future": {"x": 1},
            "gpus": [{"i": 0, "uuid": "GPU-a", "model": "NVIDIA-L4", "mem": 22563, "used": 0,
                      "mode": "whole", "new": True}]}
    inv = decode_inventory(json.dumps(wire))
    assert inv.gpus[0].mig == () and inv.gpus[0].pods == () and inv.errors == ()


_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=12)
_pod_keys = st.builds(lambda ns, n: f"{ns}/{n}", _names, _names)
_mib = st.integers(min_value=0, max_value=MAX_GPU_MIB)


@st.composite
def inventories(draw: st.DrawFn) -> Inventory:
    indexes = draw(st.lists(st.integers(0, 15), unique=True, max_size=8))
    gpus = []
    for i in indexes:
        mode = draw(st.sampled_from([GpuMode.WHOLE, GpuMode.MIG, GpuMode.SHARED]))
        mig = ()
        if mode is GpuMode.MIG:
            mig = tuple(draw(st.lists(st.builds(
                MigInstance, st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb", "1g.10gb+me"]),
                st.integers(0, 7), st.one_of(st.none(), _pod_keys)), max_size=7)))
        mem = draw(_mib)
        used = st.integers(0, mem)  # in use on the GPU, or by one pod: within its memory
        pods = tuple(
            PodGpuUsage(p, draw(used), draw(used))
            for p in draw(st.lists(_pod_keys, unique=True, max_size=5)))
        gpus.append(GpuInventory(i, draw(st.text(min_size=1, max_size=40)), draw(_names),
                                 mem, draw(used), mode, mig, pods))
    return Inventory(draw(_names), draw(st.integers(0, 2**40)), tuple(gpus),
                     tuple(draw(st.lists(st.text(max_size=30), max_size=3))))


@given(inventories())
def test_round_trip_property(inv: Inventory) -> None:
    assert decode_inventory(encode_inventory(inv)) == inv
    assert not meaningfully_changed(inv, decode_inventory(encode_inventory(inv)), 0)


BASE = json.loads(encode_inventory(example()))


def mutated(path: list[str | int], value: object) -> str:
    wire = json.loads(json.dumps(BASE))
    target = wire
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(wire)


@pytest.mark.parametrize(
    ("text", "field", "shown"),
    [
        ("{not json", "<json>", "{not json"),
        ("[]", "<root>", "[]"),
        (mutated(["v"], 2), "v", "2"),
        (mutated(["v"], True), "v", "True"),
        (mutated(["node"], ""), "node", "''"),
        (mutated(["node"], KeyError), "node", "None"),
        (mutated(["ts"], -1), "ts", "-1"),
        (mutated(["ts"], 1.5), "ts", "1.5"),
        (mutated(["gpus"], {}), "gpus", "{}"),
        (mutated(["gpus", 0, "i"], "0"), "gpus[0].i", "'0'"),
        (mutated(["gpus", 1, "i"], 0), "gpus[1].i", "0"),
        (mutated(["gpus", 0, "mem"], -5), "gpus[0].mem", "-5"),
        (mutated(["gpus", 0, "mode"], "fractional"), "gpus[0].mode", "'fractional'"),
        (mutated(["gpus", 1, "mig"], [{"p": "1g.10gb", "s": 0}]), "gpus[1].mig", "1g.10gb"),
        (mutated(["gpus", 0, "mig", 2, "s"], None), "gpus[0].mig[2].s", "None"),
        (mutated(["gpus", 0, "mig", 1, "owner"], "no-slash"), "gpus[0].mig[1].owner",
         "'no-slash'"),
        (mutated(["gpus", 0, "mig", 1, "p"], ""), "gpus[0].mig[1].p", "''"),
        (mutated(["gpus", 0, "pods", 0, "pod"], "a/b/c"), "gpus[0].pods[0].pod", "'a/b/c'"),
        (mutated(["gpus", 0, "pods", 1, "pod"], "asr/w-1"), "gpus[0].pods[1].pod", "asr/w-1"),
        (mutated(["gpus", 0, "pods", 0, "peak"], False), "gpus[0].pods[0].peak", "False"),
        (mutated(["gpus", 0, "uuid"], 7), "gpus[0].uuid", "7"),
        (mutated(["err"], [1]), "err[0]", "1"),
    ],
)
def test_bad_inputs_name_field_and_value(text: str, field: str, shown: str) -> None:
    with pytest.raises(InventoryError) as info:
        decode_inventory(text)
    assert info.value.field == field
    assert field in str(info.value) and shown in str(info.value)


def test_meaningfully_changed() -> None:
    inv = example()
    assert meaningfully_changed(None, inv, 256)
    assert not meaningfully_changed(inv, replace(inv, ts=inv.ts + 600), 256)
    g0 = inv.gpus[0]

    def with_gpu0(**kw: object) -> Inventory:
        return replace(inv, gpus=(replace(g0, **kw), *inv.gpus[1:]))

    assert not meaningfully_changed(inv, with_gpu0(used_mib=g0.used_mib + 200), 256)
    assert meaningfully_changed(inv, with_gpu0(used_mib=g0.used_mib + 300), 256)
    assert meaningfully_changed(inv, with_gpu0(mig=g0.mig[:3]), 256)  # layout changed
    assert meaningfully_changed(
        inv, with_gpu0(mig=(*g0.mig[:3], MigInstance("3g.40gb", 4, None))), 256)  # owner left
    pods = g0.pods
    assert not meaningfully_changed(
        inv, with_gpu0(pods=(replace(pods[0], used_mib=pods[0].used_mib + 100), pods[1])), 256)
    assert meaningfully_changed(
        inv, with_gpu0(pods=(pods[0], replace(pods[1], peak_mib=pods[1].peak_mib + 1024))), 256)
    assert meaningfully_changed(inv, with_gpu0(pods=pods[:1]), 256)  # a pod left
    assert meaningfully_changed(inv, with_gpu0(mode=GpuMode.WHOLE, mig=()), 256)
    assert meaningfully_changed(inv, replace(inv, gpus=inv.gpus[:2]), 256)
    assert meaningfully_changed(inv, replace(inv, errors=()), 256)



@pytest.mark.parametrize(("path", "value", "shown"), [
    # A GPU index past the node cap, memory past 1 TiB, memory in use (on the GPU, or by
    # a pod, now or at its peak) past the GPU's memory; None: at the bound, read.
    (["gpus", 0, "i"], 10**18, str(10**18)),
    (["gpus", 0, "i"], 64, "at most 64 GPUs"),
    (["gpus", 0, "i"], 63, None),
    (["gpus", 0, "mem"], 10**30, "1 TiB"),
    (["gpus", 0, "mem"], (1 << 20) + 1, "<= 1048576"),
    (["gpus", 0, "mem"], 1 << 20, None),
    (["gpus", 1, "used"], 46069, "gpus[1].mem"),
    (["gpus", 1, "used"], 10**12, str(10**12)),
    (["gpus", 1, "used"], 46068, None),
    (["gpus", 1, "pods", 0, "used"], 46069, "<= 46068"),
    (["gpus", 1, "pods", 0, "peak"], 10**30, "gpus[1].mem"),
    (["gpus", 1, "pods", 0, "peak"], 46068, None),
])
def test_upper_bounds_name_field_and_value(path: list[str | int], value: int,
                                           shown: str | None) -> None:
    field = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")
    text = mutated(path, value)
    if shown is None:
        decode_inventory(text)
        return
    with pytest.raises(InventoryError) as info:
        decode_inventory(text)
    assert info.value.field == field
    assert field in str(info.value) and str(value) in str(info.value)
    assert shown in str(info.value)
