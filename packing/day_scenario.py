"""Day scenarios: a cluster and the services on it, scaled by their autoscalers over a day.

A day scenario is plain data (decoded YAML; the bundled one is
``gpupack/scenarios/default.yaml``, whose comments give its sources and assumptions).
This module checks it and expands it into a :class:`packing.day.Day`: the nodes (one pool
per ``nodes`` entry), one workload per service, and the events (replica targets every
``step``, LeaderWorkerSet rollouts). Errors name the field.

Each service's pods are built twice over, as the two clusters the replay compares would
run them: the **request as written without gpupack** (the one device resource its
manifest must name, ``without-gpupack``: ``nvidia.com/mig-1g.10gb``,
``nvidia.com/gpu.shared``, ...; ``gpus: N`` for whole GPUs), and the **Pod as written
for gpupack** (``gpupack.io/gpu-memory`` and ``gpupack.io/class`` annotations and no
device resource, for the admission webhook to size; whole-GPU pods and LeaderWorkerSet
members name ``nvidia.com/gpu`` as they do anywhere). A share's request carries the GPU
memory the service really uses (``gpu-memory``), which neither kube-scheduler nor the
device plugin sees, so that the validator can tell whether a GPU's memory is
over-committed.

Replica targets: ``replicas: {night: a, peak: b, peak-at: "HH:MM", noise: f}`` follows
``a + (b - a) * (1 + cos(2 pi (t - peak_at) / 24 h)) / 2``, times a seeded factor
uniform in ``[1 - f, 1 + f]`` drawn per step (an autoscaler tracking a noisy load),
rounded and never below 0; ``replicas: N`` is constant. A LeaderWorkerSet's ``groups``
takes the same form, and ``rollouts: ["HH:MM", ...]`` replaces its groups at those times.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packing.catalog import models_with_profile, profile_from_resource
from packing.day import Day, DayPod, Event, Pool, Rollout, Scale, Workload
from packing.model import GroupRef, NodeInfo, PodRequest, RequestKind
from packing.quantity import cpu_milli, memory_mib
from packing.scenario import ScenarioError, get_field, parse_pools, quantity

DAY_S = 24 * 3600
SHARED_RESOURCE = "nvidia.com/gpu.shared"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
GPUPACK_SCHEDULER = "gpupack"
LWS = "leaderworkerset.sigs.k8s.io/"


def is_day(data: Any) -> bool:
    """Whether decoded YAML is a day scenario (it has ``services``), not an arrival
    scenario (:mod:`packing.scenario`)."""
    return isinstance(data, Mapping) and "services" in data


def clock(text: Any, where: str) -> float:
    """Seconds from midnight of ``"HH:MM"``."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise ScenarioError(f"{where}: {text!r} is not a time of day (HH:MM)")
    hh, mm = text.split(":")
    if not (hh.isdigit() and mm.isdigit() and int(hh) < 24 and int(mm) < 60):
        raise ScenarioError(f"{where}: {text!r} is not a time of day (HH:MM)")
    return int(hh) * 3600.0 + int(mm) * 60.0


def duration(text: Any, where: str) -> float:
    """Seconds of ``"15m"``, ``"1h"``, ``"90s"`` (or a number of seconds)."""
    if isinstance(text, int | float) and not isinstance(text, bool) and text > 0:
        return float(text)
    units = {"s": 1, "m": 60, "h": 3600}
    if isinstance(text, str) and text[-1:] in units and text[:-1].isdigit() and int(text[:-1]):
        return float(int(text[:-1]) * units[text[-1]])
    raise ScenarioError(f"{where}: {text!r} is not a duration (like 15m, 1h, 90s)")


@dataclass(frozen=True)
class Curve:
    night: int
    peak: int
    peak_at: float
    noise: float

    def at(self, t: float, rng: random.Random) -> int:
        base = self.night + (self.peak - self.night) * (
            1 + math.cos(2 * math.pi * (t - self.peak_at) / DAY_S)) / 2
        factor = 1 + self.noise * (2 * rng.random() - 1) if self.noise else 1.0
        return max(0, round(base * factor))


def _curve(v: Any, where: str) -> Curve:
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 0:
            raise ScenarioError(f"{where}: {v} is negative")
        return Curve(v, v, 0.0, 0.0)
    if not isinstance(v, Mapping):
        raise ScenarioError(f"{where}: expected a count or {{night, peak, peak-at}}")
    night = get_field(v, "night", where, int)
    peak = get_field(v, "peak", where, int)
    if night < 0 or peak < 0:
        raise ScenarioError(f"{where}: counts must not be negative")
    noise = v.get("noise", 0.0)
    if not isinstance(noise, int | float) or isinstance(noise, bool) or not 0 <= noise < 1:
        raise ScenarioError(f"{where}.noise: {noise!r} is not a fraction in [0, 1)")
    return Curve(night, peak, clock(v.get("peak-at", "12:00"), f"{where}.peak-at"),
                 float(noise))


@dataclass(frozen=True)
class Service:
    """One service of the scenario and how its pods are written."""

    namespace: str
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int  # whole GPUs per pod (0: a small pod)
    gpu_memory_mib: int  # small pods: what the model needs
    klass: str
    resource: str  # small pods: the device resource named without gpupack
    group_size: int  # LeaderWorkerSet group size (0: a Deployment)

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.name}"

    def request(self, name: str, group: GroupRef | None) -> PodRequest:
        """The pod as written without gpupack (see the module docstring)."""
        kind, profile, count = RequestKind.WHOLE, None, self.gpus
        if not self.gpus:
            count = 0
            profile = profile_from_resource(self.resource)
            kind = RequestKind.MIG if profile is not None else RequestKind.SHARED
        return PodRequest(key=f"{self.namespace}/{name}", cpu_milli=self.cpu_milli,
                          memory_mib=self.memory_mib, kind=kind, gpu_count=count,
                          mig_profile=profile, gpu_memory_mib=self.gpu_memory_mib,
                          group=group, klass=self.klass)

    def manifest(self, name: str, group_index: int, worker: int, revision: int
                 ) -> dict[str, Any]:
        """The Pod as written for gpupack (see the module docstring)."""
        requests = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}
        limits: dict[str, Any] = {}
        labels = {"app": self.name}
        annotations = {"gpupack.io/class": self.klass}
        if self.gpus:
            limits[GPU_RESOURCE] = self.gpus
        else:
            annotations["gpupack.io/gpu-memory"] = f"{self.gpu_memory_mib}Mi"
        if self.group_size:
            labels.update({f"{LWS}name": self.name, f"{LWS}group-index": str(group_index),
                           f"{LWS}worker-index": str(worker),
                           f"{LWS}template-revision-hash": f"r{revision}"})
            annotations[f"{LWS}size"] = str(self.group_size)
        resources: dict[str, Any] = {"requests": requests}
        if limits:
            resources["limits"] = limits
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels,
                             "annotations": annotations},
                "spec": {"schedulerName": GPUPACK_SCHEDULER,
                         "containers": [{"name": "server", "image": f"{self.name}:serve",
                                         "resources": resources}]}}

    def make(self, name: str, group_index: int, worker: int, revision: int) -> DayPod:
        group = None
        if self.group_size:
            group = GroupRef(f"{self.namespace}/{self.name}/{group_index}", self.group_size,
                             worker)
        return DayPod(key=f"{self.namespace}/{name}", workload=self.workload,
                      request=self.request(name, group),
                      manifest=self.manifest(name, group_index, worker, revision))


def _service(c: Any, where: str) -> tuple[Service, Curve, tuple[float, ...]]:
    if not isinstance(c, Mapping):
        raise ScenarioError(f"{where}: expected a mapping")
    name = get_field(c, "name", where, str)
    namespace = get_field(c, "namespace", where, str, "default")
    gpus = get_field(c, "gpus", where, int, 0) if "gpus" in c else 0
    if gpus < 0:
        raise ScenarioError(f"{where}.gpus: {gpus} is negative")
    size = 0
    if "lws" in c:
        lws = get_field(c, "lws", where, Mapping)
        size = get_field(lws, "size", f"{where}.lws", int)
        if size < 1:
            raise ScenarioError(f"{where}.lws.size: {size} must be at least 1")
        if not gpus:
            raise ScenarioError(f"{where}.lws: a LeaderWorkerSet here takes whole GPUs "
                                f"(gpus: N)")
    gpu_mem = 0
    resource = ""
    if not gpus:
        gpu_mem = quantity(memory_mib, get_field(c, "gpu-memory", where, (str, int)),
                       f"{where}.gpu-memory")
        if gpu_mem <= 0:
            raise ScenarioError(f"{where}.gpu-memory: must be more than zero")
        resource = get_field(c, "without-gpupack", where, str)
        profile = profile_from_resource(resource)
        if resource != SHARED_RESOURCE and (profile is None or not models_with_profile(profile)):
            raise ScenarioError(f"{where}.without-gpupack: {resource!r} is neither "
                                f"{SHARED_RESOURCE} nor a MIG resource of a known GPU")
    svc = Service(namespace, name, quantity(cpu_milli, c.get("cpu", 1), f"{where}.cpu"),
                  quantity(memory_mib, c.get("memory", "1Gi"), f"{where}.memory"), gpus, gpu_mem,
                  str(c.get("class", "whole" if gpus else "small")), resource, size)
    key = "groups" if size else "replicas"
    curve = _curve(get_field(c, key, where, (int, Mapping)), f"{where}.{key}")
    rollouts = c.get("rollouts", [])
    if rollouts and not size:
        raise ScenarioError(f"{where}.rollouts: only a LeaderWorkerSet (lws) rolls out here")
    if not isinstance(rollouts, list):
        raise ScenarioError(f"{where}.rollouts: expected a list of times")
    times = tuple(clock(r, f"{where}.rollouts[{i}]") for i, r in enumerate(rollouts))
    return svc, curve, times


@dataclass(frozen=True)
class DayScenario:
    day: Day
    services: tuple[Service, ...]
    step_s: float
    seed: int


def parse_day(data: Any) -> DayScenario:
    if not isinstance(data, Mapping):
        raise ScenarioError("scenario: expected a mapping at the top")
    seed = get_field(data, "seed", "scenario", int, 0) if "seed" in data else 0
    hours = get_field(data, "hours", "scenario", (int, float), 24)
    if not 0 < hours <= 24 * 7:
        raise ScenarioError(f"scenario.hours: {hours} is not within (0, 168]")
    step = duration(data.get("step", "15m"), "scenario.step")
    specs_nodes = get_field(data, "nodes", "scenario", list)
    pools = parse_pools(specs_nodes)
    nodes: list[NodeInfo] = [n for _, p in pools for n in p]
    # Nodes the sizing search may add: as many again of each kind.
    spare = parse_pools([{**spec, "count": 2 * spec["count"]} for spec in specs_nodes])
    specs = get_field(data, "services", "scenario", list)
    services: list[Service] = []
    events: list[tuple[float, int, Event]] = []
    rng = random.Random(seed)
    end = float(hours) * 3600
    order = 0
    for i, c in enumerate(specs):
        svc, curve, rollouts = _service(c, f"services[{i}]")
        if any(s.workload == svc.workload for s in services):
            raise ScenarioError(f"services[{i}].name: {svc.workload} is used twice")
        services.append(svc)
        last = None
        t = 0.0
        while t < end:
            n = curve.at(t, rng)
            if n != last:
                events.append((t, order, Scale(t, svc.workload, n)))
                order += 1
                last = n
            t += step
        for r in rollouts:
            if r < end:
                events.append((r, order, Rollout(r, svc.workload)))
                order += 1
    events.sort(key=lambda e: (e[0], e[1]))
    workloads = {s.workload: Workload(s.workload, "lws" if s.group_size else "deployment",
                                      s.make, s.group_size or 1) for s in services}
    day = Day(tuple(nodes), workloads, tuple(e for _, _, e in events), end,
              tuple(Pool(name, tuple(more), len(p))
                    for (name, p), (_, more) in zip(pools, spare, strict=True)))
    return DayScenario(day, tuple(services), step, seed)


def services_table(services: Sequence[Service]) -> list[str]:
    """One line per service: what it asks for with and without gpupack."""
    out = []
    for s in services:
        if s.gpus:
            ask = f"{s.gpus} whole GPU(s)" + (f" x {s.group_size} pods per group"
                                              if s.group_size else "")
            out.append(f"{s.workload}: {ask}")
        else:
            out.append(f"{s.workload}: {s.gpu_memory_mib / 1024:g} GiB of GPU memory; "
                       f"without gpupack {s.resource}")
    return out
