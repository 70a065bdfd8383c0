"""GPU model catalog: memory, MIG capability and MIG geometry per GPU model.

Facts come from ``reference/mig-geometry.md`` (profiles, slices, allowed starts) and
``reference/nvidia-gpu-stack.md`` (GFD product labels, MIG resource names). Pure data
and lookups: no I/O.

Memory figures of whole GPUs are nominal (marketing GB x 1024 MiB). Drivers report a
little less (an H100 80GB HBM3 reports 81559 MiB, an L4 23034 MiB), which is why
:func:`match_product` compares memory by nearest variant, never by equality.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GENERIC_PREFIX = "generic-"


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of a MIG-capable GPU model."""

    name: str  # "1g.10gb", "1g.10gb+me", "2g.20gb" ...
    compute_slices: int
    memory_slices: int  # NVML placement "size": consecutive memory slices it occupies
    memory_mib: int
    starts: tuple[int, ...]  # allowed start memory-slice indices
    max_count: int  # most instances of this profile on one GPU
    media_extensions: bool = False  # "+me" profile: at most one such instance per GPU

    @property
    def resource_name(self) -> str:
        """Device-plugin resource (mixed strategy): ``+`` is written as ``.``."""
        return MIG_RESOURCE_PREFIX + self.name.replace("+", ".")


@dataclass(frozen=True)
class MigGeometry:
    """Slices of one MIG-capable GPU model and the profiles it offers."""

    compute_slices: int  # 7 (4 on A30)
    memory_slices: int  # 8 (4 on A30)
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile:
        for p in self.profiles:
            if p.name == name:
                return p
        valid = ", ".join(p.name for p in self.profiles)
        raise KeyError(f"unknown MIG profile {name!r} for this GPU; valid profiles: {valid}")

    def has_profile(self, name: str) -> bool:
        return any(p.name == name for p in self.profiles)

    @property
    def profile_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.profiles)

    @property
    def classic(self) -> tuple[MigProfile, ...]:
        """Every profile except the ``+me`` (media extensions) ones.

        The "1g double memory" profile (e.g. ``1g.20gb`` on H100-80GB) is included: it is
        an ordinary instance; only ``+me`` carries the one-per-GPU rule that makes it a
        poor default for packing.
        """
        return tuple(p for p in self.profiles if not p.media_extensions)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model as the packer knows it."""

    name: str  # canonical catalog name, e.g. "H100-80GB"; "generic-<MiB>MiB" if unknown
    memory_mib: int
    mig: MigGeometry | None
    products: tuple[str, ...]  # GFD nvidia.com/gpu.product spellings
    generic: bool = False

    @property
    def mig_capable(self) -> bool:
        return self.mig is not None


# --- MIG geometries -------------------------------------------------------------------

# Placement classes of 7-compute / 8-memory-slice parts (reference table):
# (compute slices, memory slices, max per GPU, allowed starts).
_ONE_G = (1, 1, 7, (0, 1, 2, 3, 4, 5, 6))
_ONE_G_ME = (1, 1, 1, (0, 1, 2, 3, 4, 5, 6))
_ONE_G_DOUBLE = (1, 2, 4, (0, 2, 4, 6))
_TWO_G = (2, 2, 3, (0, 2, 4))
_THREE_G = (3, 4, 2, (0, 4))
_FOUR_G = (4, 4, 1, (0,))
_SEVEN_G = (7, 8, 1, (0,))


def _profile(name: str, cls: tuple[int, int, int, tuple[int, ...]], memory_mib: int) -> MigProfile:
    compute, memory, max_count, starts = cls
    return MigProfile(
        name=name,
        compute_slices=compute,
        memory_slices=memory,
        memory_mib=memory_mib,
        starts=starts,
        max_count=max_count,
        media_extensions=name.endswith("+me"),
    )


def _seven_slice(names: tuple[str, str, str, str, str, str], mib: tuple[int, ...]) -> MigGeometry:
    """Geometry of a 7/8-slice part from its 1g, 1g-double, 2g, 3g, 4g, 7g names and sizes.

    The ``1g+me`` profile shares the 1g size; every such part offers it.
    """
    one, double, two, three, four, seven = names
    m1, m_double, m2, m3, m4, m7 = mib
    return MigGeometry(
        compute_slices=7,
        memory_slices=8,
        profiles=(
            _profile(one, _ONE_G, m1),
            _profile(one + "+me", _ONE_G_ME, m1),
            _profile(double, _ONE_G_DOUBLE, m_double),
            _profile(two, _TWO_G, m2),
            _profile(three, _THREE_G, m3),
            _profile(four, _FOUR_G, m4),
            _profile(seven, _SEVEN_G, m7),
        ),
    )


def _gb(*figures: int) -> tuple[int, ...]:
    """MiB from the GB figure in profile names, for parts whose doc gives no size.

    ``1g.5gb`` -> 5 * 1024. Real instances are a little smaller (an A100-40GB 1g.5gb
    reports 4.75 GiB), so a pod sized at the exact name figure may not fit in practice;
    the reference lists measured sizes only for H100-80GB, H200 and A30.
    """
    return tuple(g * 1024 for g in figures)


# A100 40GB: sizes not in the reference -> name figures (see _gb).
_A100_40 = _seven_slice(
    ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    _gb(5, 10, 10, 20, 20, 40),
)
# A100 80GB: sizes not in the reference -> name figures.
_A100_80 = _seven_slice(
    ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    _gb(10, 20, 20, 40, 40, 80),
)
# H100 80GB (SXM5, PCIe): sizes reported by nvidia-smi, in GiB: 9.75, 19.62 (19.625),
# 19.62, 39.50, 39.50, 79.25.
_H100_80 = _seven_slice(
    ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    (9984, 20096, 20096, 40448, 40448, 81152),
)
# H100 NVL 94GB: sizes not in the reference -> name figures.
_H100_94 = _seven_slice(
    ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    _gb(12, 24, 24, 47, 47, 94),
)
# H100 96GB (GH200) and H20: (unconfirmed) in the reference: names and counts seen,
# placements assumed equal to the confirmed 7-slice parts. Sizes -> name figures.
_H100_96 = _seven_slice(
    ("1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    _gb(12, 24, 24, 48, 48, 96),
)
# H200 141GB: (unconfirmed) placements, assumed as above. Sizes reported, in GiB:
# 16.00, 32.25, 32.25, 69.50, 69.50, 139.75.
_H200 = _seven_slice(
    ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    (16384, 33024, 33024, 71168, 71168, 143104),
)
# B200: (unconfirmed) placements, assumed as above. Sizes -> name figures.
_B200 = _seven_slice(
    ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    _gb(23, 45, 45, 90, 90, 180),
)
# A30 24GB: 4 compute / 4 memory slices (confirmed). Sizes reported, in GiB: 5.81
# (5.8125), 11.69 (11.6875), 23.50.
_A30 = MigGeometry(
    compute_slices=4,
    memory_slices=4,
    profiles=(
        _profile("1g.6gb", (1, 1, 4, (0, 1, 2, 3)), 5952),
        _profile("1g.6gb+me", (1, 1, 1, (0, 1, 2, 3)), 5952),
        _profile("2g.12gb", (2, 2, 2, (0, 2)), 11968),
        _profile("2g.12gb+me", (2, 2, 1, (0, 2)), 11968),
        _profile("4g.24gb", (4, 4, 1, (0,)), 24064),
    ),
)


# --- models ---------------------------------------------------------------------------

_MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "A100-40GB",
        40 * 1024,
        _A100_40,
        ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB"),
    ),
    GpuModel(
        "A100-80GB",
        80 * 1024,
        _A100_80,
        ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe", "NVIDIA-A100-PCIE-80GB"),
    ),
    GpuModel(
        "H100-80GB",
        80 * 1024,
        _H100_80,
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-SXM5-80GB"),
    ),
    GpuModel("H100-94GB", 94 * 1024, _H100_94, ("NVIDIA-H100-NVL",)),
    # GH200 480GB counts CPU memory in its name; its GPU has 96 GB of HBM3.
    GpuModel("H100-96GB", 96 * 1024, _H100_96, ("NVIDIA-GH200-480GB",)),
    GpuModel("H20", 96 * 1024, _H100_96, ("NVIDIA-H20",)),
    GpuModel("H200-141GB", 141 * 1024, _H200, ("NVIDIA-H200", "NVIDIA-H200-NVL")),
    # B200 MIG is (unconfirmed) in the reference; 180 GB is what the 7g profile exposes.
    GpuModel("B200", 180 * 1024, _B200, ("NVIDIA-B200",)),
    GpuModel("A30-24GB", 24 * 1024, _A30, ("NVIDIA-A30",)),
    # No MIG: time-slicing or MPS only.
    GpuModel("L4", 24 * 1024, None, ("NVIDIA-L4",)),
    GpuModel("L20", 48 * 1024, None, ("NVIDIA-L20",)),
    GpuModel("L40S", 48 * 1024, None, ("NVIDIA-L40S",)),
    GpuModel("A10", 24 * 1024, None, ("NVIDIA-A10",)),
    GpuModel("T4", 16 * 1024, None, ("Tesla-T4", "NVIDIA-T4")),
    # openb trace models (Alibaba). P100/V100/T4/A10 memory from public specs.
    GpuModel("P100", 16 * 1024, None, ("Tesla-P100-PCIE-16GB", "Tesla-P100-SXM2-16GB")),
    GpuModel("V100M16", 16 * 1024, None, ("Tesla-V100-SXM2-16GB", "Tesla-V100-PCIE-16GB")),
    GpuModel(
        "V100M32",
        32 * 1024,
        None,
        (
            "Tesla-V100-SXM2-32GB",
            "Tesla-V100-PCIE-32GB",
            "Tesla-V100-SXM3-32GB",
            "Tesla-V100S-PCIE-32GB",
        ),
    ),
    # G2, G3: GPU types the trace leaves unnamed; their memory is not in the trace (the
    # trace schedules by milli-GPU only). Assumed here: G2 16 GiB, G3 32 GiB. Only memory
    # -aware policies see this figure; change it here if the models become known.
    GpuModel("G2", 16 * 1024, None, ()),
    GpuModel("G3", 32 * 1024, None, ()),
)

CATALOG: Mapping[str, GpuModel] = MappingProxyType({m.name: m for m in _MODELS})

_GENERIC_RE = re.compile(r"^generic-(\d+)mib$", re.IGNORECASE)


def generic_model(memory_mib: int) -> GpuModel:
    """A non-MIG model for a GPU the catalog does not know, sized by its memory."""
    if memory_mib <= 0:
        raise ValueError(f"generic GPU model needs a positive memory size, got {memory_mib}")
    return GpuModel(f"{GENERIC_PREFIX}{memory_mib}MiB", memory_mib, None, (), generic=True)


def get_model(name: str) -> GpuModel:
    """The catalog model by canonical name, or a generic model for ``generic-<n>MiB``."""
    model = CATALOG.get(name)
    if model is not None:
        return model
    m = _GENERIC_RE.match(name)
    if m and int(m.group(1)) > 0:
        return generic_model(int(m.group(1)))
    known = ", ".join(CATALOG)
    raise KeyError(f"unknown GPU model {name!r}; known models: {known}, or generic-<MiB>MiB")


# --- product matching -----------------------------------------------------------------


def _normalize(text: str) -> str:
    """Upper case, runs of spaces/underscores/dashes as one dash."""
    return re.sub(r"[\s_\-]+", "-", text.strip().upper()).strip("-")


# GFD adds "-MIG-<profile>" under the single MIG strategy and "-SHARED" when shared and
# not renamed; either may follow the other.
_SUFFIX_RE = re.compile(r"(-SHARED|-MIG(-[0-9]+G\.[0-9]+GB([.+\-][A-Z.]+)?)?)$")
_PREFIXES = ("NVIDIA-", "TESLA-")


def _strip_decorations(norm: str) -> str:
    while True:
        stripped = _SUFFIX_RE.sub("", norm)
        for prefix in _PREFIXES:
            if stripped.startswith(prefix):
                stripped = stripped[len(prefix) :]
        if stripped == norm:
            return norm
        norm = stripped


# Exact spellings (products and canonical names), decorations stripped.
_EXACT: dict[str, GpuModel] = {}
for _model in _MODELS:
    for _spelling in (_model.name, *_model.products):
        _EXACT.setdefault(_strip_decorations(_normalize(_spelling)), _model)


@dataclass(frozen=True)
class _Family:
    variants: tuple[str, ...]  # catalog names; the first is the default
    nvl: str | None = None  # variant an "NVL" token selects


# Families by the first token of a decorated-stripped product name. Used when a spelling
# is not listed exactly: the variant comes from a "<n>GB" token, an "NVL" token, the
# reported memory (nearest), else the family default.
_FAMILIES: dict[str, _Family] = {
    "A100": _Family(("A100-40GB", "A100-80GB")),
    "H100": _Family(("H100-80GB", "H100-94GB", "H100-96GB"), nvl="H100-94GB"),
    # GH200 comes with 96 GB (HBM3) or 144 GB (HBM3e) GPU memory; the 144 GB part is
    # an H200-class GPU.
    "GH200": _Family(("H100-96GB", "H200-141GB")),
    "H200": _Family(("H200-141GB",)),
    "H20": _Family(("H20",)),
    "B200": _Family(("B200",)),
    "A30": _Family(("A30-24GB",)),
    "L4": _Family(("L4",)),
    "L20": _Family(("L20",)),
    "L40S": _Family(("L40S",)),
    "A10": _Family(("A10",)),
    "T4": _Family(("T4",)),
    "P100": _Family(("P100",)),
    "V100": _Family(("V100M16", "V100M32")),
    "V100S": _Family(("V100M32",)),
}

_GB_TOKEN_RE = re.compile(r"^(\d+)GB?$")


def _pick_variant(family: _Family, tokens: list[str], memory_mib: int | None) -> GpuModel:
    variants = [CATALOG[v] for v in family.variants]
    if len(variants) == 1:
        return variants[0]
    for token in tokens:
        m = _GB_TOKEN_RE.match(token)
        if m:
            gib = int(m.group(1))
            for v in variants:
                if v.memory_mib == gib * 1024:
                    return v
    if family.nvl is not None and "NVL" in tokens:
        return CATALOG[family.nvl]
    if memory_mib is not None and memory_mib > 0:
        # Reported memory is a few percent under nominal; nearest wins (40 vs 80 GB,
        # 80 vs 94 vs 96 GB are far enough apart).
        return min(variants, key=lambda v: abs(v.memory_mib - memory_mib))
    return variants[0]


def match_product(product: str | None, memory_mib: int | None = None) -> GpuModel:
    """The catalog model for a GFD ``nvidia.com/gpu.product`` label.

    Tolerates case, ``-``/`` ``/``_``, ``NVIDIA-``/``Tesla-`` prefixes, form-factor
    suffixes (SXM4, PCIE, HBM3 ...) and GFD's ``-MIG-<profile>``/``-SHARED`` suffixes.
    ``memory_mib`` (``nvidia.com/gpu.memory``) picks the variant when the name does not.
    An unknown product with a usable memory size gives a generic non-MIG model; with
    neither, ValueError.
    """
    if product is not None and product.strip():
        key = _strip_decorations(_normalize(product))
        exact = _EXACT.get(key)
        if exact is not None:
            return exact
        generic = _GENERIC_RE.match(key)
        if generic is not None and int(generic.group(1)) > 0:
            return generic_model(int(generic.group(1)))
        tokens = key.split("-")
        family = _FAMILIES.get(tokens[0])
        if family is not None:
            return _pick_variant(family, tokens[1:], memory_mib)
    if memory_mib is not None and memory_mib > 0:
        return generic_model(memory_mib)
    raise ValueError(
        f"cannot identify GPU model: product {product!r} is unknown and memory "
        f"{memory_mib!r} MiB is not a usable size"
    )


# --- sharing ---------------------------------------------------------------------------

# How the NVIDIA device plugin shares a whole GPU among pods (``sharing.timeSlicing`` or
# ``sharing.mps`` of its config; GFD label ``nvidia.com/gpu.sharing-strategy``). Both
# advertise ``replicas`` devices per GPU under the same resource name.
SHARING_TIME_SLICING = "time-slicing"  # no memory isolation: neighbours can OOM each other
SHARING_MPS = "mps"  # each client capped at memory / replicas (and compute 1 / replicas)


def mps_client_mib(memory_mib: int, replicas: int) -> int:
    """The memory cap of one MPS client: the device plugin splits the GPU's memory
    equally over its replicas (the whole GPU without a replica count)."""
    return memory_mib // replicas if replicas > 1 else memory_mib


# --- MIG lookups ----------------------------------------------------------------------

_MIG_RESOURCE_RE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb)((?:\.[a-z][a-z0-9]*)*)$")


def profile_from_resource(resource: str) -> str | None:
    """``nvidia.com/mig-1g.10gb.me`` -> ``1g.10gb+me``; not a MIG resource -> None.

    Attributes after the size are joined back with ``+`` (the device plugin writes ``+``
    as ``.``). A trailing ``.shared`` (time-sliced MIG resource renamed by the device
    plugin) is not part of the profile and is dropped.
    """
    m = _MIG_RESOURCE_RE.match(resource)
    if m is None:
        return None
    base, attrs = m.group(1), m.group(2)
    if attrs.endswith(".shared"):
        attrs = attrs[: -len(".shared")]
    return base + ("+" + attrs[1:] if attrs else "")


def models_with_profile(profile: str) -> tuple[GpuModel, ...]:
    """Catalog models offering a MIG profile of this name, in catalog order."""
    return tuple(m for m in _MODELS if m.mig is not None and m.mig.has_profile(profile))


def profile_compute_milli(geometry: MigGeometry, profile: MigProfile) -> float:
    """A profile's share of the GPU's compute, in milli-GPUs (1g of 7 = 142.86)."""
    return profile.compute_slices * 1000 / geometry.compute_slices


def fitting_profiles(model: GpuModel, memory_mib: int, compute_milli: int = 0
                     ) -> list[MigProfile]:
    """The non-``+me`` profiles of ``model`` holding the memory and compute asked,
    smallest first (fewest memory slices, then fewest compute slices). Empty if the model
    has no MIG or nothing fits."""
    if model.mig is None:
        return []
    geometry = model.mig
    fitting = [
        p
        for p in geometry.classic
        if p.memory_mib >= memory_mib and profile_compute_milli(geometry, p) >= compute_milli
    ]
    return sorted(fitting, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_mib, p.name))


def smallest_fitting_profile(
    model: GpuModel, memory_mib: int, compute_milli: int = 0
) -> MigProfile | None:
    """The smallest non-``+me`` profile of ``model`` holding the memory and compute asked
    (see :func:`fitting_profiles`); None if the model has no MIG or nothing fits."""
    fitting = fitting_profiles(model, memory_mib, compute_milli)
    return fitting[0] if fitting else None
