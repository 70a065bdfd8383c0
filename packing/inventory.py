"""The node inventory the node agent publishes, and its compact JSON codec.

The agent writes one Node annotation, :data:`INVENTORY_ANNOTATION`, holding what the API
server cannot show: each GPU's real mode, its MIG instances with their placements and
owners, and per-pod GPU memory (current and peak). The extender decodes it to replace the
per-GPU detail it would otherwise infer from GFD labels and allocatable.

Wire format, version 1 (short keys because annotations count against the object size)::

    {"v":1,"node":"n1","ts":1700000000,
     "gpus":[{"i":0,"uuid":"GPU-...","model":"NVIDIA-H100-80GB-HBM3","mem":81559,
              "used":20480,"mode":"mig",
              "mig":[{"p":"3g.40gb","s":4,"owner":"ns/pod"}],
              "pods":[{"pod":"ns/pod","used":18000,"peak":19000}]}],
     "err":["gpu 2: nvmlDeviceGetMemoryInfo: GpuIsLost"]}

``model`` is the product name as GPU Feature Discovery writes it in
``nvidia.com/gpu.product`` (spaces replaced by dashes), so the extender maps it to a
catalog model the same way it maps the label. Unknown keys are ignored on decode_inventory so a
newer agent can add fields without breaking an older extender; a change that older
readers would misread must bump ``v``.

Pure: no I/O and no clock; ``ts`` is given by the caller.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from packing.model import MAX_NODE_GPUS, GpuMode, MigInstance, is_pod_key

INVENTORY_ANNOTATION = "gpupack.io/inventory"
INVENTORY_VERSION = 1

# GPU memory the decoder takes at most, whatever the model: 1 TiB, several times the
# largest GPU made (B200: 180 GB, B300: 288 GB), so no real GPU is refused, while a
# corrupt figure cannot make room for shares (or peaks) of any size. The catalog bounds
# a known model far tighter (kube.objects).
MAX_GPU_MIB = 1 << 20

# The agent cannot observe FRACTIONAL (a trace-replay mode), so it is not a wire value.
_WIRE_MODES: dict[str, GpuMode] = {
    GpuMode.WHOLE.value: GpuMode.WHOLE,
    GpuMode.MIG.value: GpuMode.MIG,
    GpuMode.SHARED.value: GpuMode.SHARED,
}


class InventoryError(ValueError):
    """An inventory annotation that cannot be decoded; names the offending field."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"inventory field {field}: expected {expected}, got {shown}")
        self.field = field
        self.value = value


@dataclass(frozen=True)
class PodGpuUsage:
    """GPU memory one pod uses on one GPU (all its processes there), in MiB."""

    pod: str  # "namespace/name"
    used_mib: int
    peak_mib: int


@dataclass(frozen=True)
class GpuInventory:
    """One physical GPU as observed on the node."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    used_mib: int
    mode: GpuMode
    mig: tuple[MigInstance, ...] = ()
    pods: tuple[PodGpuUsage, ...] = ()


@dataclass(frozen=True)
class Inventory:
    """Everything one agent reports for its node at one instant."""

    node: str
    ts: int  # unix seconds
    gpus: tuple[GpuInventory, ...] = ()
    errors: tuple[str, ...] = ()

    def gpu(self, index: int) -> GpuInventory:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)


# ----------------------------------------------------------------------------- encode_inventory


def to_wire(inv: Inventory) -> dict[str, object]:
    """The JSON-ready dict of ``inv`` (what :func:`encode_inventory` serialises)."""
    return {
        "v": INVENTORY_VERSION,
        "node": inv.node,
        "ts": inv.ts,
        "gpus": [
            {
                "i": g.index,
                "uuid": g.uuid,
                "model": g.model,
                "mem": g.memory_mib,
                "used": g.used_mib,
                "mode": g.mode.value,
                "mig": [{"p": m.profile, "s": m.start, "owner": m.owner} for m in g.mig],
                "pods": [{"pod": p.pod, "used": p.used_mib, "peak": p.peak_mib} for p in g.pods],
            }
            for g in inv.gpus
        ],
        "err": list(inv.errors),
    }


def encode_inventory(inv: Inventory) -> str:
    """Compact, deterministic JSON (no spaces, insertion-ordered keys)."""
    return json.dumps(to_wire(inv), separators=(",", ":"), ensure_ascii=False)


# ----------------------------------------------------------------------------- decode_inventory


def _field(obj: Mapping[str, object], key: str, path: str) -> object:
    if key not in obj:
        raise InventoryError(f"{path}{key}", None, "a value (field missing)")
    return obj[key]


def _int(obj: Mapping[str, object], key: str, path: str, minimum: int = 0,
         maximum: int | None = None, why: str = "") -> int:
    """An integer field within ``[minimum, maximum]``; ``why`` says what the maximum is."""
    value = _field(obj, key, path)
    # bool is an int subclass in Python; true/false is never a valid count or index.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InventoryError(f"{path}{key}", value, f"an integer >= {minimum}")
    if maximum is not None and value > maximum:
        raise InventoryError(f"{path}{key}", value,
                             f"an integer <= {maximum}" + (f" ({why})" if why else ""))
    return value


def _str(obj: Mapping[str, object], key: str, path: str, *, empty_ok: bool = False) -> str:
    value = _field(obj, key, path)
    if not isinstance(value, str) or (not empty_ok and not value):
        raise InventoryError(f"{path}{key}", value, "a non-empty string")
    return value


def _list(obj: Mapping[str, object], key: str, path: str) -> Sequence[object]:
    # Lists are optional on the wire: an older or minimal writer may leave them out.
    value = obj.get(key, [])
    if not isinstance(value, list):
        raise InventoryError(f"{path}{key}", value, "a list")
    return value


def _obj(value: object, path: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise InventoryError(path, value, "an object")
    return value


def _pod_key(value: object, path: str) -> str:
    if not is_pod_key(value):
        raise InventoryError(path, value, 'a pod key "namespace/name"')
    return value


def _decode_gpu(raw: object, path: str) -> GpuInventory:
    g = _obj(raw, path)
    p = path + "."
    # Memory first: what is in use on the GPU, or by one pod on it, is bounded by it.
    mem = _int(g, "mem", p, maximum=MAX_GPU_MIB, why="1 TiB, more than any GPU has")
    within = f"the GPU's memory, {p}mem"
    mode_raw = _field(g, "mode", p)
    if not isinstance(mode_raw, str) or mode_raw not in _WIRE_MODES:
        raise InventoryError(f"{p}mode", mode_raw, "one of " + "|".join(_WIRE_MODES))
    mode = _WIRE_MODES[mode_raw]
    mig: list[MigInstance] = []
    for j, m_raw in enumerate(_list(g, "mig", p)):
        mp = f"{p}mig[{j}]"
        m = _obj(m_raw, mp)
        owner_raw = m.get("owner")
        owner = None if owner_raw is None else _pod_key(owner_raw, f"{mp}.owner")
        mig.append(MigInstance(profile=_str(m, "p", mp + "."), start=_int(m, "s", mp + "."),
                               owner=owner))
    if mig and mode is not GpuMode.MIG:
        raise InventoryError(f"{p}mig", g.get("mig"), f"no MIG instances in mode {mode_raw}")
    pods: list[PodGpuUsage] = []
    for j, u_raw in enumerate(_list(g, "pods", p)):
        up = f"{p}pods[{j}]"
        u = _obj(u_raw, up)
        key = _pod_key(_field(u, "pod", up + "."), f"{up}.pod")
        # The agent sums a pod's processes per GPU, so a repeat means a broken writer.
        if any(q.pod == key for q in pods):
            raise InventoryError(f"{up}.pod", key, "a pod not already listed on this GPU")
        pods.append(PodGpuUsage(pod=key,
                                used_mib=_int(u, "used", up + ".", maximum=mem, why=within),
                                peak_mib=_int(u, "peak", up + ".", maximum=mem, why=within)))
    return GpuInventory(
        index=_int(g, "i", p, maximum=MAX_NODE_GPUS - 1,
                   why=f"a node has at most {MAX_NODE_GPUS} GPUs"),
        uuid=_str(g, "uuid", p),
        model=_str(g, "model", p),
        memory_mib=mem,
        used_mib=_int(g, "used", p, maximum=mem, why=within),
        mode=mode,
        mig=tuple(mig),
        pods=tuple(pods),
    )


def from_wire(raw: object) -> Inventory:
    """Validate a parsed JSON value and build the :class:`Inventory`."""
    top = _obj(raw, "<root>")
    version = _field(top, "v", "")
    if isinstance(version, bool) or version != INVENTORY_VERSION:
        raise InventoryError("v", version, f"version {INVENTORY_VERSION}")
    gpus = tuple(_decode_gpu(g, f"gpus[{k}]") for k, g in enumerate(_list(top, "gpus", "")))
    seen: set[int] = set()
    for k, g in enumerate(gpus):
        if g.index in seen:
            raise InventoryError(f"gpus[{k}].i", g.index, "a GPU index not already listed")
        seen.add(g.index)
    errors: list[str] = []
    for k, e in enumerate(_list(top, "err", "")):
        if not isinstance(e, str):
            raise InventoryError(f"err[{k}]", e, "a string")
        errors.append(e)
    return Inventory(node=_str(top, "node", ""), ts=_int(top, "ts", ""), gpus=gpus,
                     errors=tuple(errors))


def decode_inventory(text: str) -> Inventory:
    """Parse the annotation value; raises :class:`InventoryError` on any bad input."""
    try:
        raw = json.loads(text)
    except (TypeError, ValueError) as e:
        raise InventoryError("<json>", text, f"valid JSON ({e})") from e
    except RecursionError:
        # A nested annotation must not escape as RecursionError: the cache would relist
        # its Nodes for ever and never sync.
        raise InventoryError("<json>", text[:40], "JSON nested less deeply") from None
    return from_wire(raw)


# ----------------------------------------------------------------------------- change


def _shape(g: GpuInventory) -> tuple[object, ...]:
    return (g.index, g.uuid, g.model, g.memory_mib, g.mode, g.mig,
            tuple(sorted(p.pod for p in g.pods)))


def meaningfully_changed(old: Inventory | None, new: Inventory, mem_tolerance_mib: int) -> bool:
    """Whether ``new`` says something the scheduler should see that ``old`` did not.

    Structure (GPUs, modes, MIG layout and owners, which pods sit where, errors) must
    match exactly; memory figures may drift by up to ``mem_tolerance_mib`` so that normal
    allocator jitter does not cause an API write every interval. ``ts`` is ignored.
    """
    if old is None or old.node != new.node or old.errors != new.errors:
        return True
    if len(old.gpus) != len(new.gpus):
        return True
    old_by_index = {g.index: g for g in old.gpus}
    for g in new.gpus:
        o = old_by_index.get(g.index)
        if o is None or _shape(o) != _shape(g):
            return True
        if abs(o.used_mib - g.used_mib) > mem_tolerance_mib:
            return True
        old_pods = {p.pod: p for p in o.pods}
        for p in g.pods:
            op = old_pods[p.pod]
            if (abs(op.used_mib - p.used_mib) > mem_tolerance_mib
                    or abs(op.peak_mib - p.peak_mib) > mem_tolerance_mib):
                return True
    return False
