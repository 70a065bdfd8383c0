"""packing.dra.nvidia: the slices and classes are shaped as the NVIDIA DRA driver's
(device names, attributes, counters, layout), valid for the v1 API's limits, and read back
by the parser."""

from __future__ import annotations

from decimal import Decimal

import pytest
from dra_builders import nvidia_node

from packing.catalog import get_model
from packing.dra import nvidia
from packing.dra.parse import parse_resource_slice


def test_split_layout_h100() -> None:
    slices = nvidia_node("n1", gpus=2)
    counters, gpu0, gpu1 = slices
    assert [s.name for s in slices] == ["00000-gpu.nvidia.com-n1-x", "00001-gpu.nvidia.com-n1-x",
                                        "00002-gpu.nvidia.com-n1-x"]
    assert all(s.resource_slice_count == 3 and s.pool == "n1" and s.node_name == "n1"
               for s in slices)
    assert counters.devices == () and [c.name for c in counters.shared_counters] == [
        "gpu-0-counter-set", "gpu-1-counter-set"]
    cs = counters.shared_counters[0].counters
    assert cs["memory-slice-7"] == 1 and cs["multiprocessors"] == 132
    assert set(cs) >= {"copy-engines", "jpeg-engines", "ofa-engines", "decoders", "memory"}
    names = [d.name for d in gpu0.devices]
    # 1 whole GPU + 7 1g + 7 1g+me + 4 1g.20gb + 3 2g + 2 3g + 1 4g + 1 7g, sorted by name
    assert len(names) == 26 and names == sorted(names)
    assert names[:3] == ["gpu-0", "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1"]
    assert "gpu-0-mig-1g10gb-me-20-6" in names and names[-1] == "gpu-0-mig-7g80gb-0-0"
    mig = next(d for d in gpu0.devices if d.name == "gpu-0-mig-3g40gb-9-4")
    assert mig.attributes["profile"] == "3g.40gb" and mig.attributes["type"] == "mig"
    assert mig.attributes["parentUUID"] == gpu0.devices[0].attributes["uuid"]
    used = mig.consumes_counters[0]
    assert used.counter_set == "gpu-0-counter-set"
    assert {k for k in used.counters if k.startswith("memory-slice")} == {
        f"memory-slice-{i}" for i in range(4, 8)}
    assert used.counters["memory"] == Decimal(40448 * 2**20)
    whole = gpu0.devices[0]
    assert whole.consumes_counters[0].counters == cs  # the whole GPU takes everything
    assert gpu1.devices[0].name == "gpu-1"


def test_a100_in_mig_mode_has_no_whole_gpu_under_dynamic_mig() -> None:
    specs = [nvidia.GpuSpec(0, "A100-40GB", mig_mode=True), nvidia.GpuSpec(1, "A100-40GB")]
    _c, g0, g1 = nvidia_node(specs=specs)
    assert g0.devices[0].name == "gpu-0-mig-1g10gb-15-0"
    assert g1.devices[0].name == "gpu-1" and g1.devices[1].name == "gpu-1-mig-1g10gb-15-0"
    assert "gpu-1-mig-1g5gb-19-6" in {d.name for d in g1.devices}


def test_static_layout() -> None:
    specs = [nvidia.GpuSpec(0, "H100-80GB"),
             nvidia.GpuSpec(1, "H100-80GB", mig_mode=True,
                            static_mig=(("3g.40gb", 4), ("1g.10gb", 0)))]
    (s,) = nvidia_node(specs=specs, layout=nvidia.Layout.STATIC)
    assert [d.name for d in s.devices] == ["gpu-0", "gpu-1-mig-3g40gb-9-4",
                                           "gpu-1-mig-1g10gb-19-0"]
    assert s.shared_counters == () and all(not d.consumes_counters for d in s.devices)
    mig = s.devices[1]
    assert {k for k in mig.capacity if k.startswith("memorySlice")} == {
        "memorySlice4", "memorySlice5", "memorySlice6", "memorySlice7"}
    assert mig.attributes["uuid"] != s.devices[2].attributes["uuid"]
    with pytest.raises(ValueError, match="cannot start at memory slice 3"):
        nvidia.node_slices("n", [nvidia.GpuSpec(0, "H100-80GB", mig_mode=True,
                                                static_mig=(("3g.40gb", 3),))],
                           layout=nvidia.Layout.STATIC)


@pytest.mark.parametrize(("mode", "default", "extra"), [
    ("memory", Decimal(81152 * 2**20), None), ("unlimited", Decimal(0), None),
    ("4", Decimal(0), "shares")])
def test_consumable_shares(mode: str, default: Decimal, extra: str | None) -> None:
    _c, g0 = nvidia_node(gpus=1, info=nvidia.DriverInfo(consumable_shares=mode))
    whole = g0.devices[0]
    assert whole.allow_multiple_allocations
    policy = whole.capacity["memory"].request_policy
    assert policy is not None and policy.default == default
    assert policy.valid_range is not None and policy.valid_range.step == Decimal(2**20)
    assert (extra in whole.capacity) if extra else "shares" not in whole.capacity


def test_every_catalog_mig_model_fits_the_api_limits() -> None:
    for model in ("A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB", "B200",
                  "A30-24GB"):
        specs = [nvidia.GpuSpec(i, model) for i in range(8)]
        raw = nvidia.node_slices("n", specs)
        assert len(raw[0]["spec"]["sharedCounters"]) <= 8  # maxItems of sharedCounters
        for body in raw[1:]:
            assert len(body["spec"]["devices"]) <= 64  # with counters: at most 64 devices
            names = [d["name"] for d in body["spec"]["devices"]]
            assert names == sorted(names) and all(len(n) <= 63 for n in names)
        mig = get_model(model).mig
        assert mig is not None
        per_gpu = sum(len(p.starts) for p in mig.profiles) + 1
        assert len(parse_resource_slice(raw[1]).devices) == per_gpu


def test_classes_are_the_charts() -> None:
    gpu, mig = nvidia.device_classes()
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    assert gpu["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'")
    assert "extendedResourceName" not in mig["spec"]
