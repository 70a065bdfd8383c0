"""What the webhook reads of a pod: its containers and their GPU resources, a small pod's
need (``gpupack.io/gpu-memory`` and ``gpu-compute`` through their one reader in
:mod:`kube.annotations`, ``isolation``, the class defaults), where it may run (node
selector, required node affinity, tolerations, ``spec.nodeName``), which container gets
the slice, its class (:func:`classify`) and the webhook's own annotations. Every field
that cannot be read is a :class:`~webhook.decision.PodError` naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from kube import annotations as A
from kube.constraints import NodeLevel, Requirement, Term, spec_node_level
from kube.objects import ObjectError
from packing.catalog import (
    profile_from_resource,
)
from packing.model import GPU_MILLI
from packing.quantity import QuantityError, parse_quantity
from webhook.config import WHOLE_CLASSES, Isolation, WebhookConfig
from webhook.decision import Conflict, Kind, PodError

# Annotations of the webhook that kube/annotations.py does not name.
CONTAINER = A.PREFIX + "container"  # which container gets the GPU slice


STRICT = A.PREFIX + "strict"  # "true": unsafe sharing is denied, not warned (pod or namespace)


# "set": on a time-sliced share, set a vLLM/SGLang server's memory fraction to the share.
MEMORY_FRACTION = A.PREFIX + "memory-fraction"


SHARING_KEY = A.SHARING_STRATEGY  # nvidia.com/gpu.sharing-strategy (GFD): none|time-slicing|mps


DEFAULT_SCHEDULER = "default-scheduler"


PRODUCT_KEY = A.PRODUCT


_SMALL_KEYS = (A.GPU_MEMORY, A.GPU_COMPUTE, A.ISOLATION)


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PodError(path, f"expected an object, got {type(value).__name__}")
    return value


def _str_map(value: Any, path: str) -> dict[str, str]:
    out = {}
    for k, v in _mapping(value, path).items():
        if not isinstance(v, str):
            raise PodError(f"{path}.{k}", f"expected a string, got {v!r}")
        out[str(k)] = v
    return out


@dataclass(frozen=True)
class Container:
    index: int
    name: str
    body: Mapping[str, Any]
    gpu: Mapping[str, Decimal]  # GPU resources from limits and requests (limits win)
    key: str = "containers"  # or "initContainers" (init containers and sidecars)
    # Where each GPU resource was read: "limits" (when there) or "requests".
    sections: Mapping[str, str] = field(default_factory=dict)

    def path(self, resource: str) -> str:
        """The field naming ``resource``: spec.containers[0].resources.limits.X"""
        section = self.sections.get(resource, "limits")
        return f"spec.{self.key}[{self.index}].resources.{section}.{resource}"


@dataclass(frozen=True)
class Pod:
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    spec: Mapping[str, Any]
    containers: tuple[Container, ...]
    # spec.initContainers, sidecars (restartPolicy: Always) included: the extender counts
    # their resources (kube.objects.pod_request), so the webhook reads them too.
    init_containers: tuple[Container, ...] = ()

    @property
    def every_container(self) -> tuple[Container, ...]:
        return self.containers + self.init_containers


def names_gpu_resource(name: str, config: WebhookConfig) -> bool:
    return (
        name in (A.GPU_RESOURCE, A.SHARED_RESOURCE, config.shared_resource)
        or profile_from_resource(name) is not None
    )


def _read_containers(spec: Mapping[str, Any], key: str, config: WebhookConfig
                     ) -> tuple[Container, ...]:
    raw = spec.get(key)
    raw = [] if raw is None else raw
    if not isinstance(raw, list):
        raise PodError(f"spec.{key}", "expected a list")
    containers = []
    for i, c in enumerate(raw):
        path = f"spec.{key}[{i}]"
        if not isinstance(c, Mapping):
            raise PodError(path, "expected an object")
        name = c.get("name", "")
        resources = _mapping(c.get("resources"), f"{path}.resources")
        gpu: dict[str, Decimal] = {}
        sections: dict[str, str] = {}
        for section in ("requests", "limits"):  # limits last: they win
            for k, v in _mapping(resources.get(section), f"{path}.resources.{section}").items():
                if not names_gpu_resource(str(k), config):
                    continue
                try:
                    gpu[str(k)] = parse_quantity(v)
                except QuantityError as e:
                    raise PodError(f"{path}.resources.{section}.{k}", str(e)) from None
                sections[str(k)] = section
        containers.append(Container(i, name if isinstance(name, str) else "", c, gpu,
                                     key, sections))
    return tuple(containers)


def read_pod(pod: Any, config: WebhookConfig) -> Pod:
    if not isinstance(pod, Mapping):
        raise PodError("object", f"expected a Pod object, got {type(pod).__name__}")
    meta = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    return Pod(
        annotations=_str_map(meta.get("annotations"), "metadata.annotations"),
        labels=_str_map(meta.get("labels"), "metadata.labels"),
        spec=spec,
        containers=_read_containers(spec, "containers", config),
        init_containers=_read_containers(spec, "initContainers", config),
    )


def ann_path(key: str) -> str:
    return f"metadata.annotations.{key}"


def gib(mib: int | float) -> str:
    """MiB as a short GiB figure: 10240 -> "10Gi", 9984 -> "9.75Gi"."""
    text = f"{mib / 1024:.2f}".rstrip("0").rstrip(".")
    return f"{text}Gi"


def _quantity_text(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


@dataclass(frozen=True)
class Ask:
    """A small pod's need, from its annotations or its class defaults."""

    klass: str
    memory_mib: int
    compute_milli: int
    isolation: Isolation
    defaults: Mapping[str, str]
    label: str  # "gpu-memory=5Gi" or "class asr (4Gi)", for messages


def read_ask(p: Pod, klass: str, config: WebhookConfig) -> Ask:
    ann = p.annotations
    class_default = config.class_defaults.get(klass)
    defaults: dict[str, str] = {}
    try:
        asked_mib = A.gpu_memory_mib(ann)
        asked_milli = A.gpu_compute_milli(ann)
    except A.AnnotationError as e:
        raise PodError(ann_path(e.key), str(e)) from None
    if asked_mib is not None:
        mem = asked_mib
        label = f"{A.GPU_MEMORY}={ann[A.GPU_MEMORY]}"
    elif class_default is not None:
        mem = class_default.memory_mib
        defaults[A.GPU_MEMORY] = _quantity_text(mem)
        label = f"class {klass} (default {gib(mem)})"
    else:
        raise PodError(
            ann_path(A.GPU_MEMORY),
            f"missing: a small GPU pod needs {A.GPU_MEMORY} (e.g. 8Gi) or {A.CLASS} "
            f"({', '.join(sorted(config.class_defaults))})",
        )
    if asked_milli is not None:
        milli = asked_milli
    elif class_default is not None and class_default.compute_milli:
        milli = class_default.compute_milli
        defaults[A.GPU_COMPUTE] = f"{milli / GPU_MILLI:g}"
    else:
        milli = 0
    raw_iso = ann.get(A.ISOLATION)
    if raw_iso is None:
        isolation = config.default_isolation
    else:
        try:
            isolation = Isolation(raw_iso)
        except ValueError:
            raise PodError(
                ann_path(A.ISOLATION), f"{raw_iso!r} is not one of mig, mps, shared, any"
            ) from None
    return Ask(klass, mem, milli, isolation, defaults, label)


_NO_CONSTRAINTS = NodeLevel()


def node_name(spec: Mapping[str, Any]) -> str:
    """``spec.nodeName`` ("" when unset): a pod that names its node runs there or
    nowhere (the kubelet of that node admits it; no scheduler places it)."""
    name = spec.get("nodeName")
    if name is None:
        return ""
    if not isinstance(name, str):
        raise PodError("spec.nodeName", f"expected a string, got {name!r}")
    return name


def _pinned(level: NodeLevel, node: str) -> NodeLevel:
    """``level`` with the pod held to ``node``, as a matchFields metadata.name In [node]
    would hold it: added to every term of the required node affinity (an empty term
    stays empty: it matches no node), or as the only term when there is none."""
    pin = Requirement("metadata.name", "In", (node,))
    if level.affinity is None:
        terms: tuple[Term, ...] = (Term((), (pin,)),)
    else:
        terms = tuple(t if not (t.expressions or t.fields)
                      else Term(t.expressions, (*t.fields, pin))
                      for t in level.affinity)
    return replace(level, affinity=terms)


def node_level(spec: Mapping[str, Any]) -> NodeLevel:
    """The pod's node selector, required node affinity and tolerations (all keys, every
    operator: read by kube.constraints, judged by packing.constraints as the extender
    judges them), and its spec.nodeName as a pin to that node; PodError naming the
    field when one cannot be read."""
    node = node_name(spec)
    if not (spec.get("nodeSelector") or spec.get("affinity") or spec.get("tolerations")):
        level = _NO_CONSTRAINTS  # most pods: nothing to read
    else:
        try:
            level = spec_node_level(spec, "spec")
        except ObjectError as e:
            field, _, problem = str(e).partition(": ")
            raise PodError(field, problem or "cannot be read") from None
    return _pinned(level, node) if node else level


def memory_fraction(p: Pod) -> bool:
    raw = p.annotations.get(MEMORY_FRACTION)
    if raw is not None and raw != "set":
        raise PodError(ann_path(MEMORY_FRACTION),
                       f'{raw!r} is not "set" (the only value; remove it to leave the '
                       "server's flags alone)")
    return raw == "set"


def gpu_container(p: Pod) -> Container:
    name = p.annotations.get(CONTAINER)
    if not p.containers:
        raise PodError("spec.containers", "a GPU pod needs at least one container")
    if name is not None:
        for c in p.containers:
            if c.name == name:
                return c
        names = ", ".join(c.name for c in p.containers)
        raise PodError(ann_path(CONTAINER), f"{name!r} is not a container of the pod ({names})")
    for c in p.containers:
        if c.gpu:
            return c
    return p.containers[0]


def res_path(c: Container, resource: str) -> str:
    return f"spec.containers[{c.index}].resources.limits.{resource}"


def init_gpu(p: Pod) -> None:
    """A small pod's slice goes to one regular container: a GPU resource in an init
    container or a sidecar (restartPolicy: Always) would be a second device the slice
    does not cover (or, for nvidia.com/gpu, turn the pod whole for the extender)."""
    for c in p.init_containers:
        if c.gpu:
            res = sorted(c.gpu)[0]
            sidecar = c.body.get("restartPolicy") == "Always"
            raise Conflict(
                c.path(res),
                f"={c.gpu[res]} asks for a GPU in {'a sidecar' if sidecar else 'an init'} "
                f"container ({c.name or c.index}), but a small pod gets one slice for one "
                "of its regular containers; remove it",
            )


def scheduler_warning(spec: Mapping[str, Any], config: WebhookConfig) -> list[str]:
    name = spec.get("schedulerName")
    if isinstance(name, str) and name not in ("", DEFAULT_SCHEDULER, config.scheduler_name):
        return [f"spec.schedulerName is {name!r}: gpupack will not place this pod"]
    return []


def is_strict(p: Pod, namespace_labels: Mapping[str, str]) -> bool:
    raw = p.annotations.get(STRICT)
    if raw is not None and raw not in ("true", "false"):
        raise PodError(ann_path(STRICT), f"{raw!r} is not true or false")
    return raw == "true" or namespace_labels.get(STRICT) == "true"


def classify(p: Pod, config: WebhookConfig) -> tuple[Kind, str]:
    """(kind before any solving, class label). Kind.MIG stands for "small"."""
    ann, labels = p.annotations, p.labels
    klass = ann.get(A.CLASS)
    if klass is not None and klass not in config.known_classes():
        known = ", ".join(sorted(config.known_classes()))
        raise PodError(ann_path(A.CLASS), f"{klass!r} is not one of {known}")
    if A.LWS_NAME in labels or A.LWS_SIZE in ann or klass in WHOLE_CLASSES:
        return Kind.WHOLE, "whole"
    small = klass is not None or any(k in ann for k in _SMALL_KEYS)
    if small:
        return Kind.MIG, klass or "small"
    # Every container, init containers and sidecars included: the extender's
    # kube.objects.pod_request counts them (an init container's nvidia.com/gpu makes the
    # pod whole there).
    gpu = {r for c in p.every_container for r in c.gpu}
    if A.GPU_RESOURCE in gpu:
        return Kind.WHOLE, "whole"
    if gpu:
        return Kind.EXPLICIT, "small"
    return Kind.SKIP, "none"
