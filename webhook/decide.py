"""What the webhook does with one pod: pure, pod dict + cluster view + config -> AdmissionDecision.

Classes of pods:
- *whole*: a LeaderWorkerSet member, ``gpupack.io/class: whole`` (or ``llm``), or
  ``nvidia.com/gpu`` >= 1 without gpupack annotations. Left as is except the scheduler.
- *explicit*: asks for a MIG or time-sliced resource itself, without gpupack
  annotations. Left as is except the scheduler.
- *small*: ``gpupack.io/gpu-memory`` (optional ``gpu-compute``, ``isolation``) or
  ``gpupack.io/class: asr|tts|small``. Gets the smallest MIG slice of a GPU model the
  cluster has room on, else a time-sliced share, pinned to the GPU product.
- anything else is skipped.

The decision also carries the facts :mod:`webhook.patch` needs (container, resource,
products) and the warnings. Conflicts with values the user set explicitly, and inputs
that cannot be read, are denials naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from enum import StrEnum
from typing import Any

from kube import annotations as A
from kube.constraints import NodeLevel, Requirement, Term, spec_node_level
from kube.objects import ObjectError
from packing.catalog import (
    CATALOG,
    MigProfile,
    fitting_profiles,
    models_with_profile,
    profile_from_resource,
)
from packing.model import GPU_MILLI, MigReconfigure, Snapshot
from packing.quantity import QuantityError, parse_quantity
from webhook.capacity import Claim, ClusterView, ModelCapacity, ShareKind
from webhook.config import WHOLE_CLASSES, Isolation, WebhookConfig
from webhook.sizing import (
    ArgEdit,
    apply_edits,
    engines_named,
    find_self_sizing,
    fraction_edits,
)

# Annotations of the webhook that kube/annotations.py does not name.
CONTAINER = A.PREFIX + "container"  # which container gets the GPU slice
STRICT = A.PREFIX + "strict"  # "true": unsafe sharing is denied, not warned (pod or namespace)
# "set": on a time-sliced share, set a vLLM/SGLang server's memory fraction to the share.
MEMORY_FRACTION = A.PREFIX + "memory-fraction"
SHARING_KEY = A.SHARING_STRATEGY  # nvidia.com/gpu.sharing-strategy (GFD): none|time-slicing|mps
DEFAULT_SCHEDULER = "default-scheduler"
PRODUCT_KEY = A.PRODUCT
_SMALL_KEYS = (A.GPU_MEMORY, A.GPU_COMPUTE, A.ISOLATION)


class Kind(StrEnum):
    SKIP = "skip"  # not a GPU pod gpupack handles: untouched
    WHOLE = "whole"  # whole GPUs: only the scheduler name
    EXPLICIT = "explicit"  # names a MIG/shared resource itself: only the scheduler name
    MIG = "mig"
    SHARED = "shared"  # a time-sliced share
    MPS = "mps"  # an MPS replica (the share resource, pinned to MPS nodes)
    DENY = "deny"


@dataclass(frozen=True)
class AdmissionDecision:
    kind: Kind
    klass: str  # asr | tts | small | whole | none | invalid (also the metrics label)
    reason: str
    status_code: int = 0  # DENY: 400 unreadable or conflicting input, 403 policy or no fit
    profile: str | None = None  # MIG
    resource: str | None = None  # MIG or SHARED: the extended resource to ask for
    models: tuple[str, ...] = ()  # catalog models the pod is pinned to
    products: tuple[str, ...] = ()  # their nvidia.com/gpu.product values
    container: int | None = None  # index in spec.containers that gets the resource
    memory_mib: int = 0
    compute_milli: int = 0
    warnings: tuple[str, ...] = ()
    # Annotations to add when absent (class defaults written out for the scheduler).
    defaults: Mapping[str, str] = field(default_factory=dict)
    reused: bool = False  # taken from the pod's own gpupack.io/decision (re-invocation)
    # The admission that made the decision (the AdmissionReview uid), written as "id" in
    # gpupack.io/decision so the webhook's claim on the slice ends once its cluster view
    # shows the pod (webhook.claims). "" outside a live review (explain, tests).
    admission: str = ""
    # Node affinity on nvidia.com/gpu.sharing-strategy added to every term: ("In",
    # ("mps",)) for an MPS replica, ("NotIn", ("mps",)) for a time-sliced share where the
    # cluster has MPS GPUs (the two advertise the same resource).
    sharing: tuple[str, tuple[str, ...]] | None = None
    # gpupack.io/memory-fraction: "set": the server flags to write (webhook.sizing).
    arg_edits: tuple[ArgEdit, ...] = ()
    # The nodes counted for it (the pod's reach; None: every node): its claim applies
    # only to views of nodes it may land on.
    reach: frozenset[str] | None = field(default=None, compare=False, repr=False)
    # gpupack's bind records (kube.annotations.BIND_RECORDS) the new pod carries: removed
    # by the patch, since only a Binding may write them (webhook.patch.stale_records).
    strip: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        return self.kind is not Kind.DENY

    @property
    def small(self) -> bool:
        return self.kind in (Kind.MIG, Kind.SHARED, Kind.MPS)

    def annotation(self) -> str:
        """``gpupack.io/decision``: compact JSON the webhook recognises on re-invocation."""
        doc: dict[str, Any] = {"kind": self.kind.value}
        if self.kind is Kind.EXPLICIT:
            # Only what ends the webhook's claim: the pod's own resource and the id.
            doc["resource"] = self.resource
            if self.admission:
                doc["id"] = self.admission
            return json.dumps(doc, separators=(",", ":"), sort_keys=False)
        if self.kind is Kind.MIG:
            doc["profile"] = self.profile
        else:
            doc["share"] = self.resource
        doc["model"] = "|".join(self.models)
        doc["products"] = list(self.products)
        doc["reason"] = self.reason
        if self.admission:
            doc["id"] = self.admission
        return json.dumps(doc, separators=(",", ":"), sort_keys=False)

    @property
    def claims(self) -> bool:
        """Whether the pod takes a slice or share the claim book records: a small pod, or
        an explicit one asking for one MIG slice or share."""
        return self.small or (self.kind is Kind.EXPLICIT and self.resource is not None)

    def claim(self) -> Claim | None:
        """What the pod will take, for the webhook's claim book (None: no slice or share).
        An explicit pod's claim is what the extender reads for it (kube.objects
        pod_request, webhook.capacity.pending_claims): its MIG profile on every model
        that has it, or a share of no declared memory."""
        if self.kind is Kind.EXPLICIT and self.resource is not None:
            if self.profile is not None:
                return Claim(ShareKind.MIG, self.models, 0, profile=self.profile,
                             reach=self.reach)
            return Claim(ShareKind.SHARE, (), 0, reach=self.reach)
        if self.kind is Kind.MIG:
            return Claim(ShareKind.MIG, self.models, self.memory_mib, self.compute_milli,
                         profile=self.profile, reach=self.reach)
        if self.kind is Kind.SHARED:
            return Claim(ShareKind.SHARED, self.models, self.memory_mib, self.compute_milli,
                         reach=self.reach)
        if self.kind is Kind.MPS:
            return Claim(ShareKind.MPS, self.models, self.memory_mib, self.compute_milli,
                         reach=self.reach)
        return None


class PodError(ValueError):
    """A pod field the webhook cannot read: becomes a 400 denial naming the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


class _Conflict(ValueError):
    """A value the user set explicitly that the decision would have to overwrite."""

    def __init__(self, field: str, problem: str) -> None:
        sep = "" if problem.startswith("=") else " "
        super().__init__(f"{field}{sep}{problem}")


def deny(klass: str, code: int, message: str, warnings: Sequence[str] = ()) -> AdmissionDecision:
    return AdmissionDecision(Kind.DENY, klass, message, status_code=code, warnings=tuple(warnings))


# ---- reading the pod -------------------------------------------------------------------------


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
class _Container:
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
class _Pod:
    annotations: Mapping[str, str]
    labels: Mapping[str, str]
    spec: Mapping[str, Any]
    containers: tuple[_Container, ...]
    # spec.initContainers, sidecars (restartPolicy: Always) included: the extender counts
    # their resources (kube.objects.pod_request), so the webhook reads them too.
    init_containers: tuple[_Container, ...] = ()

    @property
    def every_container(self) -> tuple[_Container, ...]:
        return self.containers + self.init_containers


def names_gpu_resource(name: str, config: WebhookConfig) -> bool:
    return (
        name in (A.GPU_RESOURCE, A.SHARED_RESOURCE, config.shared_resource)
        or profile_from_resource(name) is not None
    )


def _read_containers(spec: Mapping[str, Any], key: str, config: WebhookConfig
                     ) -> tuple[_Container, ...]:
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
        containers.append(_Container(i, name if isinstance(name, str) else "", c, gpu,
                                     key, sections))
    return tuple(containers)


def _read_pod(pod: Any, config: WebhookConfig) -> _Pod:
    if not isinstance(pod, Mapping):
        raise PodError("object", f"expected a Pod object, got {type(pod).__name__}")
    meta = _mapping(pod.get("metadata"), "metadata")
    spec = _mapping(pod.get("spec"), "spec")
    return _Pod(
        annotations=_str_map(meta.get("annotations"), "metadata.annotations"),
        labels=_str_map(meta.get("labels"), "metadata.labels"),
        spec=spec,
        containers=_read_containers(spec, "containers", config),
        init_containers=_read_containers(spec, "initContainers", config),
    )


def _ann_path(key: str) -> str:
    return f"metadata.annotations.{key}"


def _gib(mib: int | float) -> str:
    """MiB as a short GiB figure: 10240 -> "10Gi", 9984 -> "9.75Gi"."""
    text = f"{mib / 1024:.2f}".rstrip("0").rstrip(".")
    return f"{text}Gi"


def _quantity_text(mib: int) -> str:
    return f"{mib // 1024}Gi" if mib % 1024 == 0 else f"{mib}Mi"


@dataclass(frozen=True)
class _Ask:
    """A small pod's need, from its annotations or its class defaults."""

    klass: str
    memory_mib: int
    compute_milli: int
    isolation: Isolation
    defaults: Mapping[str, str]
    label: str  # "gpu-memory=5Gi" or "class asr (4Gi)", for messages


def _read_ask(p: _Pod, klass: str, config: WebhookConfig) -> _Ask:
    ann = p.annotations
    class_default = config.class_defaults.get(klass)
    defaults: dict[str, str] = {}
    try:
        asked_mib = A.gpu_memory_mib(ann)
        asked_milli = A.gpu_compute_milli(ann)
    except A.AnnotationError as e:
        raise PodError(_ann_path(e.key), str(e)) from None
    if asked_mib is not None:
        mem = asked_mib
        label = f"{A.GPU_MEMORY}={ann[A.GPU_MEMORY]}"
    elif class_default is not None:
        mem = class_default.memory_mib
        defaults[A.GPU_MEMORY] = _quantity_text(mem)
        label = f"class {klass} (default {_gib(mem)})"
    else:
        raise PodError(
            _ann_path(A.GPU_MEMORY),
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
                _ann_path(A.ISOLATION), f"{raw_iso!r} is not one of mig, mps, shared, any"
            ) from None
    return _Ask(klass, mem, milli, isolation, defaults, label)


# ---- where the pod may run -------------------------------------------------------------------


_NO_CONSTRAINTS = NodeLevel()


def _node_name(spec: Mapping[str, Any]) -> str:
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


def _node_level(spec: Mapping[str, Any]) -> NodeLevel:
    """The pod's node selector, required node affinity and tolerations (all keys, every
    operator: read by kube.constraints, judged by packing.constraints as the extender
    judges them), and its spec.nodeName as a pin to that node; PodError naming the
    field when one cannot be read."""
    node = _node_name(spec)
    if not (spec.get("nodeSelector") or spec.get("affinity") or spec.get("tolerations")):
        level = _NO_CONSTRAINTS  # most pods: nothing to read
    else:
        try:
            level = spec_node_level(spec, "spec")
        except ObjectError as e:
            field, _, problem = str(e).partition(": ")
            raise PodError(field, problem or "cannot be read") from None
    return _pinned(level, node) if node else level


# ---- choosing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _MigFit:
    cap: ModelCapacity
    profile: MigProfile
    free: int
    waste: int  # MiB of the slice beyond what was asked


def _fits(view: ClusterView, ask: _Ask
          ) -> tuple[list[_MigFit], list[ModelCapacity], list[ModelCapacity]]:
    """MIG, time-sliced and MPS candidates on the nodes of the view (those in the pod's
    reach)."""
    mig: list[_MigFit] = []
    shared: list[ModelCapacity] = []
    mps: list[ModelCapacity] = []
    for cap in view.models.values():
        fits_mig = False
        profile = None
        if cap.mig_gpus and ask.isolation in (Isolation.MIG, Isolation.ANY):
            # The smallest fitting slice with one free (or creatable) now, else the
            # smallest fitting one that exists or may be created, which the pod then
            # waits for. A larger slice that exists beats a smaller one nothing will
            # create: kube-scheduler places a pod only on a resource some node has, so a
            # profile that no node has and none will make would leave it Pending for ever.
            fitting = fitting_profiles(cap.model, ask.memory_mib, ask.compute_milli)
            profile = next((p for p in fitting if cap.mig_available(p.name) > 0),
                           next((p for p in fitting if cap.mig_possible(p.name)), None))
            fits_mig = profile is not None
        fits_shared = (
            cap.shared_gpus > 0
            and ask.isolation in (Isolation.SHARED, Isolation.ANY)
            and cap.model.memory_mib >= ask.memory_mib
        )
        fits_mps = (
            cap.mps_gpus > 0
            and ask.isolation is not Isolation.MIG
            and cap.mps_possible(ask.memory_mib)
        )
        if fits_mig and profile is not None:
            free = cap.mig_available(profile.name)
            mig.append(_MigFit(cap, profile, free, profile.memory_mib - ask.memory_mib))
        if fits_shared:
            shared.append(cap)
        if fits_mps:
            mps.append(cap)
    return mig, shared, mps


def _possible_fits(view: ClusterView, ask: _Ask) -> list[_MigFit]:
    """Per model, the smallest fitting MIG profile that exists or may be created, free
    now or not (``_fits`` prefers a larger free one)."""
    out: list[_MigFit] = []
    if ask.isolation not in (Isolation.MIG, Isolation.ANY):
        return out
    for cap in view.models.values():
        if not cap.mig_gpus:
            continue
        fitting = fitting_profiles(cap.model, ask.memory_mib, ask.compute_milli)
        prof = next((p for p in fitting if cap.mig_possible(p.name)), None)
        if prof is not None:
            out.append(_MigFit(cap, prof, cap.mig_available(prof.name),
                               prof.memory_mib - ask.memory_mib))
    return out


def _could_hold(name: str, ask: _Ask) -> bool:
    """Whether a GPU of catalog model ``name`` could hold the pod at all, by its kind."""
    model = CATALOG.get(name)
    if model is None or model.memory_mib < ask.memory_mib:
        return False
    if ask.isolation is Isolation.MIG:
        return model.mig is not None and bool(
            fitting_profiles(model, ask.memory_mib, ask.compute_milli))
    return True


def _blocked(view: ClusterView, ask: _Ask) -> list[str]:
    """GPUs out of the pod's reach that could hold it, with the field keeping each out."""
    return [f"{name}: {why}" for name, why in view.excluded.items()
            if name not in view.models and _could_hold(name, ask)]


def _products(caps: Sequence[ModelCapacity]) -> tuple[str, ...]:
    return tuple(sorted({p for c in caps for p in c.products}))


def _choose_mig(fits: list[_MigFit], ask: _Ask, only: str | None, need_free: bool
                ) -> AdmissionDecision | None:
    """Least waste, then most free slices. Every model whose smallest fitting slice has
    the chosen name is allowed (same resource, more room for the scheduler). None when
    nothing fits, or nothing is free and ``need_free``."""
    if only is not None:
        fits = [f for f in fits if f.profile.name == only]
    free = [f for f in fits if f.free > 0]
    pool = free or ([] if need_free else fits)
    if not pool:
        return None
    best = min(pool, key=lambda f: (f.waste, -f.free, f.cap.model.name))
    same = [f for f in fits if f.profile.name == best.profile.name]
    models = tuple(sorted(f.cap.model.name for f in same))
    name = best.profile.name
    if free:
        why = (f"smallest MIG slice holding {_gib(ask.memory_mib)}"
               + (f" and {ask.compute_milli / GPU_MILLI:g} GPU" if ask.compute_milli else "")
               + f"; {_available_text([f.cap for f in same], name)} on {'|'.join(models)}")
    else:
        why = (f"smallest MIG slice holding {_gib(ask.memory_mib)}; none free now on "
               f"{'|'.join(models)}, the pod waits for one"
               + _wait_text([f.cap for f in same], name))
    return _mig_decision(ask, why, best.profile, models, [f.cap for f in same])


def _mig_decision(ask: _Ask, why: str, profile: MigProfile, models: tuple[str, ...],
                  caps: list[ModelCapacity]) -> AdmissionDecision:
    """The pod converted to ``profile``, on any of ``models``."""
    return AdmissionDecision(
        Kind.MIG,
        ask.klass,
        why,
        profile=profile.name,
        resource=profile.resource_name,
        models=models,
        products=_products(caps),
        memory_mib=ask.memory_mib,
        compute_milli=ask.compute_milli,
        defaults=ask.defaults,
    )


def _choose_cordoned(view: ClusterView, ask: _Ask, spec: Mapping[str, Any]
                     ) -> AdmissionDecision | None:
    """The smallest fitting MIG slice that exists only on cordoned nodes in reach (the
    last choice: only where nothing on a node in service holds the pod, free or not),
    least waste first; every model with a slice of that name allowed. None when no
    cordoned node has one. ``spec``: the pod's (a pod that names its node is not held
    back by a cordon: no scheduler places it)."""
    found: list[tuple[int, str, MigProfile, ModelCapacity]] = []
    for cap in view.models.values():
        for p in fitting_profiles(cap.model, ask.memory_mib, ask.compute_milli):
            if cap.mig_cordoned.get(p.name, 0) > 0:
                found.append((p.memory_mib - ask.memory_mib, cap.model.name, p, cap))
                break
    if not found:
        return None
    _, _, best, _ = min(found, key=lambda f: (f[0], f[1]))
    same = [cap for _, _, p, cap in found if p.name == best.name]
    models = tuple(sorted(c.model.name for c in same))
    held = sum(c.mig_cordoned.get(best.name, 0) for c in same)
    pinned = _node_name(spec)
    then = (f"spec.nodeName={pinned}: the kubelet runs the pod there cordoned or not"
            if pinned else "the pod waits until one is uncordoned")
    why = (f"smallest MIG slice holding {_gib(ask.memory_mib)} that a node has: {held} "
           f"on cordoned node(s) of {'|'.join(models)}, none on a node in service; {then}")
    return _mig_decision(ask, why, best, models, same)


# How a node's MIG layout stands, in the words of the reasons (see MigReconfigure).
_FIXED_WORDS = {
    MigReconfigure.NOT_OPTED_IN: "on nodes that do not opt in to MIG reconfiguration",
    MigReconfigure.FROZEN: 'on nodes that freeze their MIG layout '
                           '(gpupack.io/mig-reconfigure: "false")',
    MigReconfigure.ACTUATOR_OFF: "on nodes that opt in to MIG reconfiguration while the "
                                 "MIG actuator is off",
    MigReconfigure.ON: "in use, on nodes that may be re-partitioned when idle",
}


def _cases_text(counts: Mapping[MigReconfigure, int]) -> str:
    return ", ".join(f"{n} {_FIXED_WORDS[case]}" for case, n in counts.items())


def _available_text(caps: Sequence[ModelCapacity], profile: str) -> str:
    """"3 free", "7 to be created ...", or both: what exists apart from what the MIG
    actuator would have to make."""
    free = sum(c.mig_free.get(profile, 0) for c in caps)
    new = sum(c.mig_creatable.get(profile, 0) for c in caps)
    parts = [f"{free} free"] if free else []
    if new:
        parts.append(f"{new} creatable by the MIG actuator on nodes that opt in")
    return " and ".join(parts)


def _wait_text(caps: Sequence[ModelCapacity], profile: str) -> str:
    """Why waiting can end: instances exist (in use) and whether any layout may change."""
    existing = sum(c.mig_existing.get(profile, 0) for c in caps)
    changeable = sum(c.mig_changeable_gpus for c in caps)
    unreported = sum(c.mig_unreported_gpus for c in caps)
    fixed: dict[MigReconfigure, int] = {}
    for c in caps:
        for case, n in c.mig_fixed.items():
            fixed[case] = fixed.get(case, 0) + n
    parts = []
    if existing:
        parts.append(f"{existing} exist, all in use")
    if changeable:
        parts.append(f"{changeable} GPU(s) may be re-partitioned by the MIG actuator")
    if unreported:
        parts.append(f"{unreported} GPU(s) report MIG on but no instance yet")
    if fixed:
        parts.append("layouts stay as reported on the other MIG GPUs: "
                     + _cases_text(dict(sorted(fixed.items()))))
    return f" ({'; '.join(parts)})" if parts else ""


def _no_mig_text(view: ClusterView) -> str:
    """Why MIG-capable GPUs offer only what they have, per model ("" when all may
    change): layouts that stay as reported, and MIG off on nodes that may not be
    switched."""
    parts = []
    for c in view.models.values():
        if c.mig_fixed:
            parts.append(f"{c.model.name} layouts stay as reported: {_cases_text(c.mig_fixed)}")
        if c.mig_off:
            parts.append(f"{c.model.name} MIG off: {_cases_text(c.mig_off)}")
    return "; ".join(parts)


def _choose_shared(caps: list[ModelCapacity], ask: _Ask, config: WebhookConfig,
                   need_free: bool, avoid_mps: bool = False) -> AdmissionDecision | None:
    room = {c.model.name: c.shared_available(ask.memory_mib, ask.compute_milli) for c in caps}
    if need_free and not any(room.values()):
        return None
    if not caps:
        return None
    models = tuple(sorted(room))
    free = sum(room.values())
    why = (f"time-sliced share of {'|'.join(models)} ({_gib(ask.memory_mib)} declared); "
           + (f"{free} GPU(s) with room now" if free else "no room now, the pod waits"))
    return AdmissionDecision(
        Kind.SHARED,
        ask.klass,
        why,
        resource=config.shared_resource,
        models=models,
        products=_products(caps),
        memory_mib=ask.memory_mib,
        compute_milli=ask.compute_milli,
        defaults=ask.defaults,
        sharing=("NotIn", ("mps",)) if avoid_mps else None,
    )


def _choose_mps(caps: list[ModelCapacity], ask: _Ask, config: WebhookConfig,
                need_free: bool) -> AdmissionDecision | None:
    """An MPS replica: the device plugin caps each client at the GPU's memory / replicas,
    so a share that fits its cap cannot take its neighbours' memory."""
    room = {c.model.name: c.mps_available(ask.memory_mib, ask.compute_milli) for c in caps}
    if not caps or (need_free and not any(room.values())):
        return None
    models = tuple(sorted(room))
    free = sum(room.values())
    caps_text = ", ".join(
        f"{c.model.name} {_gib(min(x for x in c.mps_clients if x >= ask.memory_mib))}"
        for c in sorted(caps, key=lambda c: c.model.name))
    why = (f"MPS share of {'|'.join(models)} ({_gib(ask.memory_mib)} declared; memory "
           f"capped per client: {caps_text}); "
           + (f"{free} GPU(s) with a free replica now" if free else "no replica free now, "
              "the pod waits"))
    return AdmissionDecision(
        Kind.MPS,
        ask.klass,
        why,
        resource=config.shared_resource,
        models=models,
        products=_products(caps),
        memory_mib=ask.memory_mib,
        compute_milli=ask.compute_milli,
        defaults=ask.defaults,
        sharing=("In", ("mps",)),
    )


def _no_fit(view: ClusterView, ask: _Ask) -> AdmissionDecision:
    """The denial (:func:`_no_fit_text`), saying which GPUs in reach are on cordoned nodes,
    offering nothing until uncordoned."""
    d = _no_fit_text(view, ask)
    cordoned = [f"{c.cordoned_gpus} {c.model.name}" for c in view.models.values()
                if c.cordoned_gpus]
    if not cordoned:
        return d
    return replace(d, reason=f"{d.reason}; on cordoned nodes, offering nothing until "
                   f"uncordoned: {', '.join(cordoned)} GPU(s)")


def _no_fit_text(view: ClusterView, ask: _Ask) -> AdmissionDecision:
    """The denial: what the nodes in the pod's reach offer, and which GPUs out of its
    reach could have held it (naming the pod's field or the taint that keeps each out)."""
    blocked = _blocked(view, ask)
    where = (f"{view.scope} ({len(view.reach or ())} node(s) in reach): " if view.scope
             else "")
    largest = view.largest()
    if largest is None:
        if view.excluded:
            out = "; ".join(f"{m}: {why}" for m, why in view.excluded.items())
            return deny(ask.klass, 403,
                        f"{view.scope + ': ' if view.scope else ''}no node in reach has a "
                        f"GPU; cannot place {ask.label} (GPUs out of reach: {out})")
        return deny(ask.klass, 403, f"the cluster has no GPUs; cannot place {ask.label}")
    if blocked:
        return deny(
            ask.klass, 403,
            f"{ask.label}: the GPUs that could hold it are excluded by the pod's own "
            f"constraints: {'; '.join(blocked)}",
        )
    # Only slices that exist or may be created count: a profile of the geometry that no
    # node has and none will make holds nothing.
    biggest_mig = max(
        (
            (p.memory_mib, p.name, c.model.name)
            for c in view.models.values()
            if c.model.mig is not None and c.mig_gpus
            for p in c.model.mig.classic
            if c.mig_possible(p.name)
        ),
        default=None,
    )
    mig_text = (f"largest MIG slice {biggest_mig[1]} = {_gib(biggest_mig[0])} on {biggest_mig[2]}"
                if biggest_mig else "no MIG slices")
    why_not = _no_mig_text(view)
    if why_not:
        mig_text += f" [{why_not}]"
    mps_models = [(max(c.mps_clients), c.model.name) for c in view.models.values()
                  if c.mps_clients]
    shared_models = [c for c in view.models.values() if c.shared_gpus]
    shared_text = (
        "largest time-sliced GPU "
        + max((c.model.memory_mib, c.model.name) for c in shared_models)[1]
        + f" ({_gib(max(c.model.memory_mib for c in shared_models))})"
        if shared_models else "no time-sliced GPUs"
    )
    mps_text = (f"largest MPS client {_gib(max(mps_models)[0])} on {max(mps_models)[1]}"
                if mps_models else "no MPS GPUs")
    if ask.memory_mib > largest.model.memory_mib:
        return deny(
            ask.klass, 403,
            f"{where}{ask.label} is more than any GPU "
            f"{'in reach' if view.scope else 'in the cluster'} has: the largest is "
            f"{largest.model.name} with {_gib(largest.model.memory_mib)} ({mig_text})",
        )
    what = {
        Isolation.MIG: f"{A.ISOLATION}=mig, but no MIG slice holds it ({mig_text})",
        Isolation.MPS: f"{A.ISOLATION}=mps, but no MPS replica holds it ({mps_text})",
        Isolation.SHARED: (f"{A.ISOLATION}=shared, but no time-sliced GPU or MPS replica holds "
                           f"it ({shared_text}; {mps_text})" if mps_models else
                           f"{A.ISOLATION}=shared, but no time-sliced GPU holds it "
                           f"({shared_text})"),
        Isolation.ANY: f"no MIG slice or time-sliced GPU holds it ({mig_text}; {shared_text}"
                       + (f"; {mps_text})" if mps_models else ")"),
    }[ask.isolation]
    return deny(
        ask.klass, 403,
        f"{where}{ask.label}"
        + (f" and {A.GPU_COMPUTE}={ask.compute_milli / GPU_MILLI:g}" if ask.compute_milli else "")
        + f": {what}; ask for whole GPUs with {A.CLASS}: whole instead",
    )


# ---- safety of time-sliced shares -------------------------------------------------------------


def _gpu_mib(decision: AdmissionDecision) -> int:
    """Memory of the largest GPU the share may land on (0: none known)."""
    return max((CATALOG[m].memory_mib if m in CATALOG else 0 for m in decision.models),
               default=0)


def _share_fraction(decision: AdmissionDecision) -> str | None:
    """The memory fraction that keeps a server within its share on every GPU it may land
    on, two decimals rounded down ("0.25"); None when the share is the whole GPU (nothing
    to protect) or less than 1% of it."""
    gpu_mib = _gpu_mib(decision)
    if not gpu_mib or decision.memory_mib >= gpu_mib:
        return None
    hundredths = decision.memory_mib * 100 // gpu_mib
    return f"{hundredths / 100:g}" if hundredths else None


def _memory_fraction(p: _Pod) -> bool:
    raw = p.annotations.get(MEMORY_FRACTION)
    if raw is not None and raw != "set":
        raise PodError(_ann_path(MEMORY_FRACTION),
                       f'{raw!r} is not "set" (the only value; remove it to leave the '
                       "server's flags alone)")
    return raw == "set"


def _set_fraction(p: _Pod, target: _Container, decision: AdmissionDecision
                  ) -> tuple[AdmissionDecision, Mapping[str, Any], list[str]]:
    """(the decision with its flag edits, the container as it will run, what could not
    be set) for ``gpupack.io/memory-fraction: "set"`` on a time-sliced share."""
    fraction = _share_fraction(decision)
    if fraction is None or not _memory_fraction(p):
        return decision, target.body, []
    edits, problems = fraction_edits(target.body, fraction)
    who = f"container {target.name or target.index}"
    return (replace(decision, arg_edits=tuple(edits)), apply_edits(target.body, edits),
            [f"{who}: {x}" for x in problems])


def _sizing_problems(container: _Container, decision: AdmissionDecision,
                     body: Mapping[str, Any] | None = None) -> tuple[list[str], list[str]]:
    """(over-share findings, unreadable values) for the container getting a share;
    ``body``: the container as it will run (after gpupack's own flag edits)."""
    gpu_mib = _gpu_mib(decision)
    if not gpu_mib:
        return [], []
    body = container.body if body is None else body
    model = "|".join(decision.models)
    share = decision.memory_mib
    who = f"container {container.name or container.index}"
    over, unreadable = [], []
    findings = find_self_sizing(body)
    named = {f.engine for f in findings}
    for spec in engines_named(body):
        if spec.default is None and spec.engine not in named and share < gpu_mib:
            # Self-sizing with no fixed default (SGLang picks its fraction from the GPU's
            # size): nothing bounds it by the share.
            where = "args" if isinstance(body.get("args"), list) else "command"
            over.append(
                f"spec.containers[{container.index}].{where}: {spec.engine} without "
                f"{spec.flag} sizes its memory from the whole time-sliced {model} "
                f"({_gib(gpu_mib)}), not its {_gib(share)} share, and can OOM its "
                f"neighbours; set {spec.flag} <= {int(share / gpu_mib * 100) / 100:g}, "
                f'{MEMORY_FRACTION}: "set" or {A.ISOLATION}: mig'
            )
    for f in findings:
        shown = f"{f.flag} {f.raw}" if not f.defaulted else f"{f.flag} (default {f.fraction:g})"
        if f.fraction is None:
            unreadable.append(f"{who}: cannot read {f.engine} {f.flag} value {f.raw!r}")
            continue
        takes = f.fraction * gpu_mib
        if takes > share:
            over.append(
                f"{who}: {f.engine} {shown} takes {_gib(takes)} of a time-sliced {model} "
                f"({_gib(gpu_mib)}), more than its {_gib(share)} share, and can OOM its "
                f"neighbours; use <= {int(share / gpu_mib * 100) / 100:g} or "
                f"{A.ISOLATION}: mig"
            )
    return over, unreadable


# ---- the decision -----------------------------------------------------------------------------


def _target(p: _Pod) -> _Container:
    name = p.annotations.get(CONTAINER)
    if not p.containers:
        raise PodError("spec.containers", "a GPU pod needs at least one container")
    if name is not None:
        for c in p.containers:
            if c.name == name:
                return c
        names = ", ".join(c.name for c in p.containers)
        raise PodError(_ann_path(CONTAINER), f"{name!r} is not a container of the pod ({names})")
    for c in p.containers:
        if c.gpu:
            return c
    return p.containers[0]


def _res_path(c: _Container, resource: str) -> str:
    return f"spec.containers[{c.index}].resources.limits.{resource}"


def _init_gpu(p: _Pod) -> None:
    """A small pod's slice goes to one regular container: a GPU resource in an init
    container or a sidecar (restartPolicy: Always) would be a second device the slice
    does not cover (or, for nvidia.com/gpu, turn the pod whole for the extender)."""
    for c in p.init_containers:
        if c.gpu:
            res = sorted(c.gpu)[0]
            sidecar = c.body.get("restartPolicy") == "Always"
            raise _Conflict(
                c.path(res),
                f"={c.gpu[res]} asks for a GPU in {'a sidecar' if sidecar else 'an init'} "
                f"container ({c.name or c.index}), but a small pod gets one slice for one "
                "of its regular containers; remove it",
            )


def _explicit(p: _Pod, target: _Container, ask: _Ask) -> tuple[str | None, bool]:
    """The MIG profile or share the user already asked for (None, False when none).

    A whole GPU next to small-pod annotations, a GPU resource in another container or a
    count other than 1 cannot be reconciled: PodError naming it.
    """
    for c in p.containers:
        if c.index != target.index and c.gpu:
            res = sorted(c.gpu)[0]
            raise _Conflict(
                _res_path(c, res),
                f"asks for a GPU in another container than {target.name or target.index}; "
                f"name the GPU container with {CONTAINER}",
            )
    if not target.gpu:
        return None, False
    if len(target.gpu) > 1:
        raise _Conflict(_res_path(target, sorted(target.gpu)[1]), "more than one GPU resource")
    res, qty = next(iter(target.gpu.items()))
    if res == A.GPU_RESOURCE:
        raise _Conflict(
            _res_path(target, res),
            f"={qty} asks for whole GPUs, but {ask.label} asks for a slice; remove one of them",
        )
    if qty != 1:
        raise _Conflict(_res_path(target, res), f"={qty}: a small pod takes exactly one slice")
    profile = profile_from_resource(res)
    if profile is not None:
        return profile, False
    return None, True


def _reuse(p: _Pod, target: _Container, ask: _Ask, config: WebhookConfig
           ) -> AdmissionDecision | None:
    """The pod's own gpupack.io/decision, when the pod still matches it (re-invocation).

    Deciding again could pick another slice (the cluster changed in between) and then
    see its own earlier resource as a user conflict; recognising its output keeps the
    mutation idempotent, as ``reinvocationPolicy: IfNeeded`` needs.
    """
    raw = p.annotations.get(A.DECISION)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    kind, models_text, products = doc.get("kind"), doc.get("model"), doc.get("products")
    if not isinstance(models_text, str) or not isinstance(products, list):
        return None
    if not all(isinstance(x, str) for x in products):
        return None
    models = tuple(m for m in models_text.split("|") if m)
    if not models or not all(m in CATALOG for m in models):
        return None
    if kind == Kind.MIG.value and ask.isolation in (Isolation.MIG, Isolation.ANY):
        profile = doc.get("profile")
        if not isinstance(profile, str):
            return None
        for m in models:
            geom = CATALOG[m].mig
            if geom is None or not geom.has_profile(profile):
                return None
            prof = geom.profile(profile)
            if prof.memory_mib < ask.memory_mib or (
                prof.compute_slices * GPU_MILLI < ask.compute_milli * geom.compute_slices
            ):
                return None
        resource = A.MIG_RESOURCE_PREFIX + profile.replace("+", ".")
        out_kind = Kind.MIG
    elif kind == Kind.SHARED.value and ask.isolation in (Isolation.SHARED, Isolation.ANY):
        if doc.get("share") != config.shared_resource:
            return None
        if any(CATALOG[m].memory_mib < ask.memory_mib for m in models):
            return None
        profile, resource, out_kind = None, config.shared_resource, Kind.SHARED
    elif kind == Kind.MPS.value and ask.isolation is not Isolation.MIG:
        if doc.get("share") != config.shared_resource:
            return None
        if any(CATALOG[m].memory_mib < ask.memory_mib for m in models):
            return None
        profile, resource, out_kind = None, config.shared_resource, Kind.MPS
    else:
        return None
    if dict(target.gpu) != {resource: Decimal(1)}:
        return None
    if any(c.gpu for c in p.containers if c.index != target.index):
        return None
    reason = doc.get("reason")
    admission = doc.get("id")
    return AdmissionDecision(
        out_kind,
        ask.klass,
        reason if isinstance(reason, str) else "",
        profile=profile,
        resource=resource,
        models=models,
        products=tuple(products),
        container=target.index,
        memory_mib=ask.memory_mib,
        compute_milli=ask.compute_milli,
        defaults=ask.defaults,
        reused=True,
        sharing=("In", ("mps",)) if out_kind is Kind.MPS else None,
        admission=admission if isinstance(admission, str) else "",
    )


def _decision_doc(p: _Pod) -> dict[str, Any] | None:
    raw = p.annotations.get(A.DECISION)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _explicit_pod(p: _Pod, view: ClusterView, config: WebhookConfig,
                  warnings: Sequence[str]) -> AdmissionDecision:
    """An explicit pod: left as it is but for the scheduler name; the MIG slice or share
    it names is recorded as a claim (the extender counts it so: kube.objects.pod_request),
    so a burst mixing explicit and sized pods does not hand the same slice out twice."""
    base = AdmissionDecision(Kind.EXPLICIT, "small",
                             "asks for a MIG or time-sliced resource itself",
                             warnings=tuple(warnings))
    asked = {r for c in p.every_container for r, q in c.gpu.items() if q > 0}
    if len(asked) != 1:
        return base  # none asked (a count of 0), or several: the extender refuses the pod
    (res,) = asked
    profile = profile_from_resource(res)
    if profile is not None:
        models = tuple(sorted(m.name for m in models_with_profile(profile)))
        if not models:
            return base  # no GPU has it: the extender refuses the pod
    elif res in (A.SHARED_RESOURCE, config.shared_resource):
        models = ()
    else:
        return base
    try:
        reach = view.scoped(_node_level(p.spec)).reach
    except PodError:
        reach = None  # left to kube-scheduler, as before; the claim counts everywhere
    doc = _decision_doc(p)
    # The webhook's own record from an earlier invocation (webhook.admit judges whether
    # it is this admission's or a copy).
    own = (doc is not None and doc.get("kind") == Kind.EXPLICIT.value
           and doc.get("resource") == res and isinstance(doc.get("id"), str))
    return replace(base, resource=res, profile=profile, models=models, reach=reach,
                   reused=own, admission=str(doc["id"]) if own and doc else "")


def _scheduler_warning(spec: Mapping[str, Any], config: WebhookConfig) -> list[str]:
    name = spec.get("schedulerName")
    if isinstance(name, str) and name not in ("", DEFAULT_SCHEDULER, config.scheduler_name):
        return [f"spec.schedulerName is {name!r}: gpupack will not place this pod"]
    return []


def _strict(p: _Pod, namespace_labels: Mapping[str, str]) -> bool:
    raw = p.annotations.get(STRICT)
    if raw is not None and raw not in ("true", "false"):
        raise PodError(_ann_path(STRICT), f"{raw!r} is not true or false")
    return raw == "true" or namespace_labels.get(STRICT) == "true"


def classify(p: _Pod, config: WebhookConfig) -> tuple[Kind, str]:
    """(kind before any solving, class label). Kind.MIG stands for "small"."""
    ann, labels = p.annotations, p.labels
    klass = ann.get(A.CLASS)
    if klass is not None and klass not in config.known_classes():
        known = ", ".join(sorted(config.known_classes()))
        raise PodError(_ann_path(A.CLASS), f"{klass!r} is not one of {known}")
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


def decide_admission(
    pod: Any,
    cluster: ClusterView | Snapshot,
    config: WebhookConfig,
    namespace_labels: Mapping[str, str] | None = None,
) -> AdmissionDecision:
    """The webhook's decision for one Pod CREATE. Never raises on bad input."""
    view = cluster if isinstance(cluster, ClusterView) else ClusterView.of(cluster)
    klass = "invalid"
    try:
        p = _read_pod(pod, config)
        kind, klass = classify(p, config)
        warnings = _scheduler_warning(p.spec, config)
        if kind is Kind.EXPLICIT:
            return _explicit_pod(p, view, config, warnings)
        if kind in (Kind.SKIP, Kind.WHOLE):
            why = {
                Kind.SKIP: "no GPU asked for",
                Kind.WHOLE: "whole-GPU pod: resources left as they are",
            }[kind]
            return AdmissionDecision(kind, klass, why,
                                     warnings=tuple(warnings) if kind is not Kind.SKIP else ())
        ask = _read_ask(p, klass, config)
        target = _target(p)
        _init_gpu(p)
        strict = _strict(p, namespace_labels or {})
        # Read before a decision the pod carries is kept: a field that cannot be read is
        # a 400 either way, and the kept decision's claim counts the nodes in reach.
        level = _node_level(p.spec)
        decision = _reuse(p, target, ask, config)
        if decision is None:
            decision = _solve(p, target, ask, view, config, level)
            if not decision.allowed:
                return replace(decision, warnings=decision.warnings + tuple(warnings))
        else:
            decision = replace(decision, reach=view.scoped(level).reach)
        decision = replace(decision, container=target.index)
        _memory_fraction(p)  # a value other than "set" is a 400 whatever the kind
        if decision.kind is Kind.SHARED:
            decision, body, unset = _set_fraction(p, target, decision)
            warnings += unset
            over, unreadable = _sizing_problems(target, decision, body)
            if over and strict:
                return deny(klass, 403, "strict mode (gpupack.io/strict): " + "; ".join(over),
                            warnings + unreadable)
            warnings += over + unreadable
        return replace(decision, warnings=tuple(warnings))
    except PodError as e:
        return deny(klass, 400, str(e))
    except _Conflict as e:
        return deny(klass, 400, str(e))


def _solve(p: _Pod, target: _Container, ask: _Ask, view: ClusterView,
           config: WebhookConfig, level: NodeLevel) -> AdmissionDecision:
    explicit_profile, explicit_shared = _explicit(p, target, ask)
    # Only the nodes the pod can reach count (its node selector, required node
    # affinity, tolerations against taints, spec.nodeName); the same view when it sets
    # none.
    view = view.scoped(level)
    decision = _solve_in(p, target, ask, view, config, explicit_profile, explicit_shared)
    node = _node_name(p.spec)
    if node:
        pinned = f"spec.nodeName={node} holds the pod to that node (metadata.name In [{node}])"
        decision = replace(decision, reason=f"{decision.reason}; {pinned}")
    if not decision.allowed:
        return decision
    if view.scope:
        decision = replace(decision, reason=f"{decision.reason}; counting the "
                           f"{len(view.reach or ())} node(s) in reach of {view.scope}")
    return replace(decision, reach=view.reach)


def _solve_in(p: _Pod, target: _Container, ask: _Ask, view: ClusterView,
              config: WebhookConfig, explicit_profile: str | None, explicit_shared: bool
              ) -> AdmissionDecision:
    mig, shared, mps = _fits(view, ask)
    avoid_mps = any(c.mps_gpus for c in view.models.values())
    if explicit_profile is not None:
        res = _res_path(target, next(iter(target.gpu)))
        # The smallest fitting slice that exists or may be created is kept even when
        # none is free now (the pod waits for one, as a sized pod would): replicas of
        # one manifest all name it, whichever is free when each is reviewed.
        have = {f.cap.model.name for f in mig if f.profile.name == explicit_profile}
        waiting = [f for f in _possible_fits(view, ask)
                   if f.profile.name == explicit_profile and f.cap.model.name not in have]
        chosen = _choose_mig(mig + waiting, ask, explicit_profile, need_free=False)
        natural = _choose_mig(mig, ask, None, need_free=False)
        if chosen is None and ask.isolation in (Isolation.MIG, Isolation.ANY):
            # Last, a slice only cordoned nodes hold, when it is the one gpupack would
            # pick there (the smallest that holds the pod).
            chosen = _choose_cordoned(view, ask, p.spec)
            if chosen is not None and chosen.profile != explicit_profile:
                chosen = None
        # Kept only when it is what gpupack would pick on some model (free now, the
        # smallest that exists, or that only cordoned nodes hold): a bigger slice than
        # the annotation asks for is a contradiction the user must resolve.
        if chosen is None or ask.isolation is Isolation.SHARED:
            want = ""
            if natural is not None:
                want = f" (it needs {natural.resource} on {'|'.join(natural.models)})"
            raise _Conflict(res, f"conflicts with {ask.label}{want}; remove one of them")
        return chosen
    if explicit_shared:
        res = _res_path(target, next(iter(target.gpu)))
        if ask.isolation is Isolation.MIG:
            raise _Conflict(res, f"is a time-sliced share, but {A.ISOLATION}=mig")
        chosen = (_choose_mps(mps, ask, config, need_free=True)
                  or _choose_shared(shared, ask, config, need_free=True, avoid_mps=avoid_mps)
                  or _choose_mps(mps, ask, config, need_free=False)
                  or _choose_shared(shared, ask, config, need_free=False, avoid_mps=avoid_mps))
        if chosen is None:
            raise _Conflict(res, f"conflicts with {ask.label}: no time-sliced GPU holds it")
        return chosen
    # Free now before waiting; among kinds, the better isolated first: a MIG slice, an
    # MPS replica (memory capped per client), a time-sliced share.
    for attempt in (
        lambda: _choose_mig(mig, ask, None, need_free=True),
        lambda: _choose_mps(mps, ask, config, need_free=True),
        lambda: _choose_shared(shared, ask, config, need_free=True, avoid_mps=avoid_mps),
        lambda: _choose_mig(mig, ask, None, need_free=False),
        lambda: _choose_mps(mps, ask, config, need_free=False),
        lambda: _choose_shared(shared, ask, config, need_free=False, avoid_mps=avoid_mps),
    ):
        decision = attempt()
        if decision is not None:
            if decision.kind in (Kind.SHARED, Kind.MPS) and not mig \
                    and ask.isolation is Isolation.ANY:
                # Say why MIG, the safer default, was not chosen where MIG GPUs exist.
                off = _no_mig_text(view)
                if off:
                    decision = replace(decision, reason=f"{decision.reason}; no MIG slice "
                                       f"holds it ({off})")
            return decision
    # Last: a slice that only cordoned nodes hold (maintenance). Kubernetes keeps such a
    # pod Pending until a node is uncordoned; refusing it would fail every create of its
    # ReplicaSet meanwhile.
    if ask.isolation in (Isolation.MIG, Isolation.ANY):
        cordoned = _choose_cordoned(view, ask, p.spec)
        if cordoned is not None:
            return cordoned
    return _no_fit(view, ask)
