"""Simulation scenarios: a cluster and a seeded stream of arriving pods and groups.

A scenario is plain data (decoded YAML, see ``gpupack/scenarios/default.yaml``); this
module checks it and expands it into NodeInfos and arrivals. Errors name the field.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from packing.catalog import GpuModel, match_product
from packing.mig.layout import layout_from_counts
from packing.model import (
    MAX_NODE_GPUS,
    GpuInfo,
    GpuMode,
    GroupRef,
    MigInstance,
    MigReconfigure,
    NodeInfo,
    PodRequest,
    RequestKind,
)
from packing.quantity import QuantityError, cpu_milli, memory_mib, parse_quantity


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Scenario:
    nodes: tuple[NodeInfo, ...]
    arrivals: tuple[tuple[PodRequest, ...], ...]  # one pod, or all members of a group


def get_field(d: Mapping[str, Any], key: str, where: str, kind: type | tuple[type, ...],
              default: Any = None) -> Any:
    """``d[key]`` checked to be a ``kind`` (never a bool); ``default`` when it is absent
    and a default is given; ScenarioError naming ``where.key`` otherwise."""
    if key not in d:
        if default is not None:
            return default
        raise ScenarioError(f"{where}.{key}: missing")
    v = d[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise ScenarioError(f"{where}.{key}: {v!r} has the wrong type")
    return v



def quantity(conv: Any, v: Any, where: str) -> int:
    """``conv(v)`` (a Kubernetes quantity) as an int; ScenarioError naming ``where``."""
    try:
        return int(conv(v))
    except QuantityError as e:
        raise ScenarioError(f"{where}: {e}") from None



def parse_scenario(data: Any) -> Scenario:
    if not isinstance(data, Mapping):
        raise ScenarioError("scenario: expected a mapping at the top")
    seed = get_field(data, "seed", "scenario", int) if "seed" in data else 0
    nodes = [n for _, pool in parse_pools(get_field(data, "nodes", "scenario", list)) for n in pool]
    classes = get_field(data, "classes", "scenario", list)
    templates = [_template(c, f"classes[{i}]") for i, c in enumerate(classes)]
    n = get_field(data, "arrivals", "scenario", int)
    rng = random.Random(seed)
    weights = [w for _, w, _ in templates]
    arrivals: list[tuple[PodRequest, ...]] = []
    counters: dict[str, int] = {}
    for _ in range(n):
        tmpl, _, group = rng.choices(templates, weights)[0]
        idx = counters.get(tmpl.key, 0)
        counters[tmpl.key] = idx + 1
        name = f"{tmpl.key}-{idx}"
        if group is None:
            arrivals.append((_with(tmpl, f"sim/{name}", None),))
            continue
        size, topo = group
        ref = GroupRef(f"sim/{name}", size, 0, topo, topo is not None)
        members = tuple(
            _with(tmpl, f"sim/{name}-{w}", GroupRef(ref.key, size, w, topo, topo is not None))
            for w in range(size)
        )
        arrivals.append(members)
    return Scenario(tuple(nodes), tuple(arrivals))


def parse_pools(specs: Sequence[Any]) -> list[tuple[str, list[NodeInfo]]]:
    """The nodes of a scenario's ``nodes`` list, one pool (its ``prefix``) per entry:
    ``count`` nodes named ``<prefix>-<k>``. ScenarioError names the field."""
    pools: list[tuple[str, list[NodeInfo]]] = []
    for i, spec in enumerate(specs):
        where = f"nodes[{i}]"
        if not isinstance(spec, Mapping):
            raise ScenarioError(f"{where}: expected a mapping")
        try:
            model = match_product(get_field(spec, "product", where, str))
        except ValueError as e:
            raise ScenarioError(f"{where}.product: {e}") from None
        mode_text = spec.get("mode", "whole")
        try:
            mode = GpuMode(mode_text)
        except ValueError:
            raise ScenarioError(
                f"{where}.mode: {mode_text!r} is not one of whole, mig, shared"
            ) from None
        if mode is GpuMode.MIG and not model.mig_capable:
            raise ScenarioError(f"{where}.mode: {model.name} has no MIG")
        layout = _mig_layout(spec, model, mode, where)
        opt_in = spec.get("mig-reconfigure")
        if opt_in is not None and not isinstance(opt_in, bool):
            raise ScenarioError(f"{where}.mig-reconfigure: {opt_in!r} is not true or false")
        # The actuator is a setting of the run (with_mig_actuator), not of the scenario.
        reconfigure = MigReconfigure.of(opt_in, actuator=False)
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise ScenarioError(f"{where}.replicas: {replicas!r} is not a count")
        n_gpus = get_field(spec, "gpus", where, int)
        if not 0 <= n_gpus <= MAX_NODE_GPUS:
            raise ScenarioError(f"{where}.gpus: {n_gpus} is not within 0..{MAX_NODE_GPUS}")
        count = get_field(spec, "count", where, int)
        if count < 0:
            raise ScenarioError(f"{where}.count: {count} is negative")
        labels = {str(k): str(v) for k, v in (spec.get("labels") or {}).items()}
        prefix = get_field(spec, "prefix", where, str)
        if any(prefix == p for p, _ in pools):
            raise ScenarioError(f"{where}.prefix: {prefix!r} is used twice")
        pool = []
        for k in range(count):
            name = f"{prefix}-{k}"
            gpus = tuple(
                GpuInfo(g, model.name, model.memory_mib, mode, layout, replicas=replicas)
                for g in range(n_gpus)
            )
            pool.append(
                NodeInfo(
                    name,
                    quantity(cpu_milli, spec.get("cpu", 64), f"{where}.cpu"),
                    quantity(memory_mib, spec.get("memory", "256Gi"), f"{where}.memory"),
                    gpus,
                    {**labels, "kubernetes.io/hostname": name},
                    mig_reconfigure=reconfigure,
                )
            )
        pools.append((prefix, pool))
    return pools


def _mig_layout(spec: Mapping[str, Any], model: GpuModel, mode: GpuMode, where: str
                ) -> tuple[MigInstance, ...]:
    """The MIG instances every GPU of a ``mode: mig`` node reports, from ``mig-devices``
    (profile -> count, as in a mig-parted config); none when it is absent."""
    if "mig-devices" not in spec:
        return ()
    if mode is not GpuMode.MIG or model.mig is None:
        raise ScenarioError(f"{where}.mig-devices: only for mode: mig on a MIG-capable GPU")
    devices = get_field(spec, "mig-devices", where, Mapping)
    counts: dict[str, int] = {}
    for profile, n in devices.items():
        if not model.mig.has_profile(str(profile)):
            raise ScenarioError(
                f"{where}.mig-devices.{profile}: {model.name} has no such profile "
                f"(valid: {', '.join(model.mig.profile_names)})")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ScenarioError(f"{where}.mig-devices.{profile}: {n!r} is not a count")
        counts[str(profile)] = n
    slots = layout_from_counts(model.mig, counts)
    if slots is None:
        raise ScenarioError(f"{where}.mig-devices: {dict(counts)} fit no valid layout of "
                            f"{model.name}")
    return tuple(MigInstance(s.profile, s.start) for s in slots)


def _with(tmpl: PodRequest, key: str, group: GroupRef | None) -> PodRequest:
    return replace(tmpl, key=key, group=group)


def _template(c: Any, where: str) -> tuple[PodRequest, float, tuple[int, str | None] | None]:
    if not isinstance(c, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    name = get_field(c, "name", where, str)
    weight = get_field(c, "weight", where, (int, float))
    cpu = quantity(cpu_milli, c.get("cpu", 1), f"{where}.cpu")
    mem = quantity(memory_mib, c.get("memory", "1Gi"), f"{where}.memory")
    kinds = [k for k in ("mig", "shared", "whole") if k in c]
    if len(kinds) > 1:
        raise ScenarioError(f"{where}: give one of mig, shared, whole (got {', '.join(kinds)})")
    kind = RequestKind.NONE
    profile = None
    count = 0
    milli = 0
    gmem = 0
    if "mig" in c:
        kind, profile = RequestKind.MIG, get_field(c, "mig", where, str)
    elif "shared" in c:
        s = get_field(c, "shared", where, Mapping)
        kind = RequestKind.SHARED
        gmem = quantity(memory_mib, s.get("memory", "1Gi"), f"{where}.shared.memory")
        try:
            milli = int(parse_quantity(s.get("compute", 0)) * 1000)
        except QuantityError as e:
            raise ScenarioError(f"{where}.shared.compute: {e}") from None
        if not 0 <= milli <= 1000:
            raise ScenarioError(f"{where}.shared.compute: must be within 0..1")
    elif "whole" in c:
        kind, count = RequestKind.WHOLE, get_field(c, "whole", where, int)
    group = None
    if "group" in c:
        g = get_field(c, "group", where, Mapping)
        group = (get_field(g, "size", f"{where}.group", int), g.get("topology"))
    tmpl = PodRequest(
        key=name,
        cpu_milli=cpu,
        memory_mib=mem,
        kind=kind,
        gpu_count=count,
        mig_profile=profile,
        gpu_milli=milli,
        gpu_memory_mib=gmem,
        klass=str(c.get("klass", name)),
    )
    return tmpl, float(weight), group


def arrival_pods(arrivals: Sequence[tuple[PodRequest, ...]]) -> list[PodRequest]:
    return [p for a in arrivals for p in a]
