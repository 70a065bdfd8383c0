"""Catalog: models, MIG profiles, product matching, resource names, profile choice."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packing.catalog import (
    CATALOG,
    GpuModel,
    MigProfile,
    get_model,
    match_product,
    models_with_profile,
    profile_from_resource,
    smallest_fitting_profile,
)

CANONICAL = (
    "A100-40GB",
    "A100-80GB",
    "H100-80GB",
    "H100-94GB",
    "H200-141GB",
    "A30-24GB",
    "B200",
    "L4",
    "L20",
    "L40S",
    "A10",
    "T4",
    "G2",
    "G3",
    "P100",
    "V100M16",
    "V100M32",
)
MIG_MODELS = ("A100-40GB", "A100-80GB", "H100-80GB", "H100-94GB", "H200-141GB", "A30-24GB", "B200")
NON_MIG = ("L4", "L20", "L40S", "A10", "T4", "G2", "G3", "P100", "V100M16", "V100M32")


@pytest.mark.parametrize("name", CANONICAL)
def test_canonical_models_present(name: str) -> None:
    model = get_model(name)
    assert model.name == name
    assert CATALOG[name] is model
    assert not model.generic
    assert model.memory_mib > 0


@pytest.mark.parametrize("name", MIG_MODELS)
def test_mig_models_are_mig_capable(name: str) -> None:
    assert get_model(name).mig_capable


@pytest.mark.parametrize("name", NON_MIG)
def test_non_mig_models(name: str) -> None:
    model = get_model(name)
    assert not model.mig_capable
    assert model.mig is None
    assert smallest_fitting_profile(model, 1) is None


@pytest.mark.parametrize(
    ("name", "memory_gib"),
    [
        ("P100", 16),
        ("V100M16", 16),
        ("V100M32", 32),
        ("T4", 16),
        ("A10", 24),
        ("L4", 24),
        ("L20", 48),
        ("L40S", 48),
        ("A100-40GB", 40),
        ("A100-80GB", 80),
        ("H100-94GB", 94),
        ("A30-24GB", 24),
    ],
)
def test_model_memory(name: str, memory_gib: int) -> None:
    assert get_model(name).memory_mib == memory_gib * 1024


@pytest.mark.parametrize("model", [m for m in CATALOG.values() if m.mig is not None])
def test_geometry_consistent(model: GpuModel) -> None:
    geometry = model.mig
    assert geometry is not None
    names = [p.name for p in geometry.profiles]
    assert len(names) == len(set(names))
    for p in geometry.profiles:
        assert p.starts, p.name
        assert all(s >= 0 and s + p.memory_slices <= geometry.memory_slices for s in p.starts)
        assert 1 <= p.compute_slices <= geometry.compute_slices
        assert 0 < p.memory_mib <= model.memory_mib
        assert p.media_extensions == p.name.endswith("+me")
        assert p.max_count >= 1
    assert sum(1 for p in geometry.profiles if p.media_extensions) >= 1
    assert all(not p.media_extensions for p in geometry.classic)
    assert len(geometry.classic) == len(geometry.profiles) - sum(
        p.media_extensions for p in geometry.profiles
    )


@pytest.mark.parametrize(
    ("model", "profile", "compute", "memory", "memory_mib", "starts", "max_count"),
    [
        ("A100-40GB", "1g.5gb", 1, 1, 5120, (0, 1, 2, 3, 4, 5, 6), 7),
        ("A100-40GB", "1g.5gb+me", 1, 1, 5120, (0, 1, 2, 3, 4, 5, 6), 1),
        ("A100-40GB", "1g.10gb", 1, 2, 10240, (0, 2, 4, 6), 4),
        ("A100-40GB", "2g.10gb", 2, 2, 10240, (0, 2, 4), 3),
        ("A100-40GB", "3g.20gb", 3, 4, 20480, (0, 4), 2),
        ("A100-40GB", "4g.20gb", 4, 4, 20480, (0,), 1),
        ("A100-40GB", "7g.40gb", 7, 8, 40960, (0,), 1),
        ("H100-80GB", "1g.10gb", 1, 1, 9984, (0, 1, 2, 3, 4, 5, 6), 7),
        ("H100-80GB", "1g.20gb", 1, 2, 20096, (0, 2, 4, 6), 4),
        ("H100-80GB", "3g.40gb", 3, 4, 40448, (0, 4), 2),
        ("H100-80GB", "7g.80gb", 7, 8, 81152, (0,), 1),
        ("H100-94GB", "3g.47gb", 3, 4, 47 * 1024, (0, 4), 2),
        ("H200-141GB", "1g.18gb", 1, 1, 16384, (0, 1, 2, 3, 4, 5, 6), 7),
        ("H200-141GB", "7g.141gb", 7, 8, 143104, (0,), 1),
        ("B200", "2g.45gb", 2, 2, 45 * 1024, (0, 2, 4), 3),
        ("A30-24GB", "1g.6gb", 1, 1, 5952, (0, 1, 2, 3), 4),
        ("A30-24GB", "1g.6gb+me", 1, 1, 5952, (0, 1, 2, 3), 1),
        ("A30-24GB", "2g.12gb", 2, 2, 11968, (0, 2), 2),
        ("A30-24GB", "2g.12gb+me", 2, 2, 11968, (0, 2), 1),
        ("A30-24GB", "4g.24gb", 4, 4, 24064, (0,), 1),
    ],
)
def test_profile_table(
    model: str,
    profile: str,
    compute: int,
    memory: int,
    memory_mib: int,
    starts: tuple[int, ...],
    max_count: int,
) -> None:
    geometry = get_model(model).mig
    assert geometry is not None
    p = geometry.profile(profile)
    assert (p.compute_slices, p.memory_slices, p.memory_mib, p.starts, p.max_count) == (
        compute,
        memory,
        memory_mib,
        starts,
        max_count,
    )


@pytest.mark.parametrize(
    ("model", "compute", "memory"),
    [("A100-40GB", 7, 8), ("H200-141GB", 7, 8), ("B200", 7, 8), ("A30-24GB", 4, 4)],
)
def test_geometry_slices(model: str, compute: int, memory: int) -> None:
    geometry = get_model(model).mig
    assert geometry is not None
    assert (geometry.compute_slices, geometry.memory_slices) == (compute, memory)


def test_unknown_profile_error_names_valid_ones() -> None:
    geometry = get_model("A30-24GB").mig
    assert geometry is not None
    with pytest.raises(KeyError) as err:
        geometry.profile("1g.10gb")
    assert "1g.10gb" in str(err.value)
    assert "2g.12gb" in str(err.value)


def test_classic_excludes_only_media_extensions() -> None:
    geometry = get_model("A100-40GB").mig
    assert geometry is not None
    assert [p.name for p in geometry.classic] == [
        "1g.5gb",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
    ]


@pytest.mark.parametrize(
    ("name", "resource"),
    [
        ("1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("1g.10gb+me", "nvidia.com/mig-1g.10gb.me"),
        ("3g.40gb", "nvidia.com/mig-3g.40gb"),
        ("7g.141gb", "nvidia.com/mig-7g.141gb"),
    ],
)
def test_resource_name_round_trip(name: str, resource: str) -> None:
    profile = MigProfile(name, 1, 1, 1, (0,), 1, name.endswith("+me"))
    assert profile.resource_name == resource
    assert profile_from_resource(resource) == name


@pytest.mark.parametrize(
    ("resource", "profile"),
    [
        ("nvidia.com/mig-1g.10gb.me", "1g.10gb+me"),
        ("nvidia.com/mig-2g.12gb.me", "2g.12gb+me"),
        ("nvidia.com/mig-1g.5gb", "1g.5gb"),
        ("nvidia.com/mig-1g.10gb.shared", "1g.10gb"),
        ("nvidia.com/mig-1g.10gb.me.shared", "1g.10gb+me"),
        ("nvidia.com/mig-1g.23gb.me.all", "1g.23gb+me.all"),
        ("nvidia.com/gpu", None),
        ("nvidia.com/gpu.shared", None),
        ("cpu", None),
        ("nvidia.com/mig-", None),
        ("nvidia.com/mig-big", None),
        ("amd.com/mig-1g.10gb", None),
        ("", None),
    ],
)
def test_profile_from_resource(resource: str, profile: str | None) -> None:
    assert profile_from_resource(resource) == profile


@pytest.mark.parametrize("model", [m for m in CATALOG.values() if m.mig is not None])
def test_every_profile_resource_round_trips(model: GpuModel) -> None:
    assert model.mig is not None
    for p in model.mig.profiles:
        assert profile_from_resource(p.resource_name) == p.name


# Real GFD nvidia.com/gpu.product values (NVML names with spaces as dashes), plus the
# suffixes GFD adds under single MIG strategy and unrenamed sharing.
@pytest.mark.parametrize(
    ("product", "memory", "expected"),
    [
        ("NVIDIA-A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA-A100-PCIE-40GB", None, "A100-40GB"),
        ("A100-SXM4-40GB", None, "A100-40GB"),
        ("NVIDIA-A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA-A100-80GB-PCIe", None, "A100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", 81559, "H100-80GB"),
        ("NVIDIA-H100-PCIe", 81559, "H100-80GB"),
        ("NVIDIA-H100-NVL", 95830, "H100-94GB"),
        ("NVIDIA-GH200-480GB", 97871, "H100-96GB"),
        ("NVIDIA-H200", 143771, "H200-141GB"),
        ("NVIDIA-B200", 183359, "B200"),
        ("NVIDIA-A30", 24576, "A30-24GB"),
        ("NVIDIA-L4", 23034, "L4"),
        ("NVIDIA-L40S", 46068, "L40S"),
        ("NVIDIA-L20", 46068, "L20"),
        ("NVIDIA-A10", 23028, "A10"),
        ("Tesla-T4", 15360, "T4"),
        ("Tesla-P100-PCIE-16GB", 16280, "P100"),
        ("Tesla-V100-SXM2-16GB", 16160, "V100M16"),
        ("Tesla-V100-PCIE-32GB", 32510, "V100M32"),
        ("Tesla-V100S-PCIE-32GB", None, "V100M32"),
        # Single MIG strategy and sharing suffixes.
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 4864, "A100-40GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 9984, "H100-80GB"),
        ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb+me", None, "H100-80GB"),
        ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb-SHARED", None, "A100-80GB"),
        ("Tesla-T4-SHARED", 15360, "T4"),
        ("NVIDIA-L4-SHARED", None, "L4"),
        # Spelling tolerance: spaces, underscores, case, missing prefixes.
        ("NVIDIA A100 80GB PCIe", None, "A100-80GB"),
        ("nvidia_h100_nvl", None, "H100-94GB"),
        ("nvidia-l40s", None, "L40S"),
        ("T4", None, "T4"),
        ("NVIDIA-Tesla-T4", None, "T4"),
        # Memory disambiguates when the name does not carry the size.
        ("NVIDIA-A100-PCIE", 40960, "A100-40GB"),
        ("NVIDIA-A100-PCIE", 81920, "A100-80GB"),
        ("NVIDIA-A100-SXM4", 80000, "A100-80GB"),
        ("NVIDIA-H100", 81559, "H100-80GB"),
        ("NVIDIA-H100", 95830, "H100-94GB"),
        ("NVIDIA-H100", 97871, "H100-96GB"),
        ("NVIDIA-GH200-144G-HBM3e", 146000, "H200-141GB"),
        ("Tesla-V100-SXM2", 32510, "V100M32"),
        # openb trace names and canonical names.
        ("V100M16", None, "V100M16"),
        ("G2", None, "G2"),
        ("G3", None, "G3"),
        ("H100-80GB", None, "H100-80GB"),
    ],
)
def test_match_product(product: str, memory: int | None, expected: str) -> None:
    assert match_product(product, memory).name == expected


@pytest.mark.parametrize(
    ("product", "memory", "expected"),
    [
        ("NVIDIA-GeForce-RTX-4090", 24564, "generic-24564MiB"),
        ("NVIDIA-A10G", 23028, "generic-23028MiB"),  # A10G is not the A10
        ("", 16384, "generic-16384MiB"),
        (None, 8192, "generic-8192MiB"),
        ("!!??", 1000, "generic-1000MiB"),
        ("generic-40960MiB", None, "generic-40960MiB"),
    ],
)
def test_match_product_generic(product: str | None, memory: int | None, expected: str) -> None:
    model = match_product(product, memory)
    assert model.name == expected
    assert model.generic
    assert not model.mig_capable
    assert get_model(model.name) == model


@pytest.mark.parametrize(
    ("product", "memory"),
    [(None, None), ("", None), ("garbage-gpu", None), ("garbage-gpu", 0), ("   ", -5)],
)
def test_match_product_unusable(product: str | None, memory: int | None) -> None:
    with pytest.raises(ValueError) as err:
        match_product(product, memory)
    assert repr(product) in str(err.value)
    assert repr(memory) in str(err.value)


@given(st.text(max_size=40), st.one_of(st.none(), st.integers(-10, 300_000)))
def test_match_product_total(product: str, memory: int | None) -> None:
    """Any input gives a model or ValueError, never another exception."""
    try:
        model = match_product(product, memory)
    except ValueError:
        assert memory is None or memory <= 0
        return
    assert model.name in CATALOG or (model.generic and model.memory_mib > 0)
    assert get_model(model.name) == model


def test_get_model_generic_and_errors() -> None:
    model = get_model("generic-12345MiB")
    assert (model.name, model.memory_mib, model.generic, model.mig) == (
        "generic-12345MiB",
        12345,
        True,
        None,
    )
    for bad in ("H300", "generic-0MiB", "generic-xMiB", ""):
        with pytest.raises(KeyError) as err:
            get_model(bad)
        assert repr(bad) in str(err.value)
        assert "A100-40GB" in str(err.value)


@pytest.mark.parametrize(
    ("profile", "models"),
    [
        ("1g.10gb", ("A100-40GB", "A100-80GB", "H100-80GB")),
        ("1g.5gb", ("A100-40GB",)),
        ("1g.5gb+me", ("A100-40GB",)),
        ("4g.24gb", ("A30-24GB",)),
        ("1g.12gb", ("H100-94GB", "H100-96GB", "H20")),
        ("3g.71gb", ("H200-141GB",)),
        ("1g.10gb.me", ()),
        ("9g.1tb", ()),
    ],
)
def test_models_with_profile(profile: str, models: tuple[str, ...]) -> None:
    assert tuple(m.name for m in models_with_profile(profile)) == models


@pytest.mark.parametrize(
    ("model", "memory", "compute", "expected"),
    [
        ("A100-40GB", 1, 0, "1g.5gb"),
        ("A100-40GB", 5120, 0, "1g.5gb"),
        ("A100-40GB", 5121, 0, "1g.10gb"),
        ("A100-40GB", 8000, 200, "2g.10gb"),  # 1g = 142 milli: too little compute
        ("A100-40GB", 8000, 286, "3g.20gb"),  # 2g = 285.7 milli
        ("A100-40GB", 30000, 0, "7g.40gb"),
        ("A100-40GB", 20000, 500, "4g.20gb"),
        ("A100-40GB", 40961, 0, None),
        ("A100-40GB", 1, 1001, None),
        ("H100-80GB", 9984, 0, "1g.10gb"),
        ("H100-80GB", 10000, 0, "1g.20gb"),
        ("H100-80GB", 20097, 0, "3g.40gb"),
        ("H100-80GB", 60000, 0, "7g.80gb"),
        ("H100-80GB", 1000, 1000, "7g.80gb"),
        ("H200-141GB", 16000, 0, "1g.18gb"),
        ("A30-24GB", 6000, 0, "2g.12gb"),
        ("A30-24GB", 5952, 250, "1g.6gb"),
        ("A30-24GB", 5952, 251, "2g.12gb"),
        ("A30-24GB", 12000, 0, "4g.24gb"),
    ],
)
def test_smallest_fitting_profile(
    model: str, memory: int, compute: int, expected: str | None
) -> None:
    found = smallest_fitting_profile(get_model(model), memory, compute)
    assert (found.name if found else None) == expected


@given(
    st.sampled_from([m for m in CATALOG.values() if m.mig is not None]),
    st.integers(0, 200_000),
    st.integers(0, 1200),
)
def test_smallest_fitting_profile_is_smallest(model: GpuModel, memory: int, compute: int) -> None:
    assert model.mig is not None
    geometry = model.mig
    found = smallest_fitting_profile(model, memory, compute)

    def fits(p: MigProfile) -> bool:
        share = p.compute_slices * 1000 / geometry.compute_slices
        return p.memory_mib >= memory and share >= compute

    fitting = [p for p in geometry.classic if fits(p)]
    if found is None:
        assert not fitting
        return
    assert fits(found) and not found.media_extensions
    assert all(
        (found.memory_slices, found.compute_slices) <= (p.memory_slices, p.compute_slices)
        for p in fitting
    )
