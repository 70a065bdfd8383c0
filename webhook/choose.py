"""Which slice a small pod gets, in the nodes it can reach: the MIG, MPS and time-sliced
candidates per GPU model (:func:`candidates`), the choice of each kind (least waste,
then most free), the last resort of slices only cordoned nodes hold, and the denial
that says what the nodes in reach offer when nothing holds the pod (:func:`no_fit`),
with the words of the reasons.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kube import annotations as A
from packing.catalog import (
    CATALOG,
    MigProfile,
    fitting_profiles,
)
from packing.model import GPU_MILLI, MigReconfigure
from webhook.capacity import ClusterView, ModelCapacity
from webhook.config import Isolation, WebhookConfig
from webhook.decision import AdmissionDecision, Kind, deny
from webhook.pod import Ask, gib, node_name


@dataclass(frozen=True)
class _MigFit:
    cap: ModelCapacity
    profile: MigProfile
    free: int
    waste: int  # MiB of the slice beyond what was asked


def candidates(view: ClusterView, ask: Ask
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


def possible_fits(view: ClusterView, ask: Ask) -> list[_MigFit]:
    """Per model, the smallest fitting MIG profile that exists or may be created, free
    now or not (``candidates`` prefers a larger free one)."""
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


def _could_hold(name: str, ask: Ask) -> bool:
    """Whether a GPU of catalog model ``name`` could hold the pod at all, by its kind."""
    model = CATALOG.get(name)
    if model is None or model.memory_mib < ask.memory_mib:
        return False
    if ask.isolation is Isolation.MIG:
        return model.mig is not None and bool(
            fitting_profiles(model, ask.memory_mib, ask.compute_milli))
    return True


def _blocked(view: ClusterView, ask: Ask) -> list[str]:
    """GPUs out of the pod's reach that could hold it, with the field keeping each out."""
    return [f"{name}: {why}" for name, why in view.excluded.items()
            if name not in view.models and _could_hold(name, ask)]


def _products(caps: Sequence[ModelCapacity]) -> tuple[str, ...]:
    """The product labels to pin the pod to; none when a node of one of these models
    carries no label (a DRA node without GPU Feature Discovery), which a pin would keep
    the pod off."""
    if any(c.unlabelled for c in caps):
        return ()
    return tuple(sorted({p for c in caps for p in c.products}))


def choose_mig(fits: list[_MigFit], ask: Ask, only: str | None, need_free: bool
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
        why = (f"smallest MIG slice holding {gib(ask.memory_mib)}"
               + (f" and {ask.compute_milli / GPU_MILLI:g} GPU" if ask.compute_milli else "")
               + f"; {_available_text([f.cap for f in same], name)} on {'|'.join(models)}")
    else:
        why = (f"smallest MIG slice holding {gib(ask.memory_mib)}; none free now on "
               f"{'|'.join(models)}, the pod waits for one"
               + _wait_text([f.cap for f in same], name))
    return _mig_decision(ask, why, best.profile, models, [f.cap for f in same])


def _sized(kind: Kind, ask: Ask, why: str, resource: str, caps: Sequence[ModelCapacity],
           models: tuple[str, ...], **more: Any) -> AdmissionDecision:
    """The pod converted to ``resource`` of ``kind``, on any of ``models`` (``caps``:
    theirs, for the product pin)."""
    return AdmissionDecision(kind, ask.klass, why, resource=resource, models=models,
                             products=_products(caps), memory_mib=ask.memory_mib,
                             compute_milli=ask.compute_milli, defaults=ask.defaults, **more)


def _mig_decision(ask: Ask, why: str, profile: MigProfile, models: tuple[str, ...],
                  caps: list[ModelCapacity]) -> AdmissionDecision:
    """The pod converted to ``profile``, on any of ``models``."""
    return _sized(Kind.MIG, ask, why, profile.resource_name, caps, models,
                  profile=profile.name)


def choose_cordoned(view: ClusterView, ask: Ask, spec: Mapping[str, Any]
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
    pinned = node_name(spec)
    then = (f"spec.nodeName={pinned}: the kubelet runs the pod there cordoned or not"
            if pinned else "the pod waits until one is uncordoned")
    why = (f"smallest MIG slice holding {gib(ask.memory_mib)} that a node has: {held} "
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


def no_mig_text(view: ClusterView) -> str:
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


def choose_shared(caps: list[ModelCapacity], ask: Ask, config: WebhookConfig,
                   need_free: bool, avoid_mps: bool = False) -> AdmissionDecision | None:
    room = {c.model.name: c.shared_available(ask.memory_mib, ask.compute_milli) for c in caps}
    if need_free and not any(room.values()):
        return None
    if not caps:
        return None
    models = tuple(sorted(room))
    free = sum(room.values())
    why = (f"time-sliced share of {'|'.join(models)} ({gib(ask.memory_mib)} declared); "
           + (f"{free} GPU(s) with room now" if free else "no room now, the pod waits"))
    return _sized(Kind.SHARED, ask, why, config.shared_resource, caps, models,
                  sharing=("NotIn", ("mps",)) if avoid_mps else None)


def choose_mps(caps: list[ModelCapacity], ask: Ask, config: WebhookConfig,
                need_free: bool) -> AdmissionDecision | None:
    """An MPS replica: the device plugin caps each client at the GPU's memory / replicas,
    so a share that fits its cap cannot take its neighbours' memory."""
    room = {c.model.name: c.mps_available(ask.memory_mib, ask.compute_milli) for c in caps}
    if not caps or (need_free and not any(room.values())):
        return None
    models = tuple(sorted(room))
    free = sum(room.values())
    caps_text = ", ".join(
        f"{c.model.name} {gib(min(x for x in c.mps_clients if x >= ask.memory_mib))}"
        for c in sorted(caps, key=lambda c: c.model.name))
    why = (f"MPS share of {'|'.join(models)} ({gib(ask.memory_mib)} declared; memory "
           f"capped per client: {caps_text}); "
           + (f"{free} GPU(s) with a free replica now" if free else "no replica free now, "
              "the pod waits"))
    return _sized(Kind.MPS, ask, why, config.shared_resource, caps, models,
                  sharing=("In", ("mps",)))


def no_fit(view: ClusterView, ask: Ask) -> AdmissionDecision:
    """The denial (:func:`_no_fit_text`), saying which GPUs in reach are on cordoned nodes,
    offering nothing until uncordoned."""
    d = _no_fit_text(view, ask)
    cordoned = [f"{c.cordoned_gpus} {c.model.name}" for c in view.models.values()
                if c.cordoned_gpus]
    if not cordoned:
        return d
    return replace(d, reason=f"{d.reason}; on cordoned nodes, offering nothing until "
                   f"uncordoned: {', '.join(cordoned)} GPU(s)")


def _no_fit_text(view: ClusterView, ask: Ask) -> AdmissionDecision:
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
    mig_text = (f"largest MIG slice {biggest_mig[1]} = {gib(biggest_mig[0])} on {biggest_mig[2]}"
                if biggest_mig else "no MIG slices")
    why_not = no_mig_text(view)
    if why_not:
        mig_text += f" [{why_not}]"
    mps_models = [(max(c.mps_clients), c.model.name) for c in view.models.values()
                  if c.mps_clients]
    shared_models = [c for c in view.models.values() if c.shared_gpus]
    shared_text = (
        "largest time-sliced GPU "
        + max((c.model.memory_mib, c.model.name) for c in shared_models)[1]
        + f" ({gib(max(c.model.memory_mib for c in shared_models))})"
        if shared_models else "no time-sliced GPUs"
    )
    mps_text = (f"largest MPS client {gib(max(mps_models)[0])} on {max(mps_models)[1]}"
                if mps_models else "no MPS GPUs")
    if ask.memory_mib > largest.model.memory_mib:
        return deny(
            ask.klass, 403,
            f"{where}{ask.label} is more than any GPU "
            f"{'in reach' if view.scope else 'in the cluster'} has: the largest is "
            f"{largest.model.name} with {gib(largest.model.memory_mib)} ({mig_text})",
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


def choose_whole(view: ClusterView, ask: Ask, need_free: bool) -> AdmissionDecision | None:
    """A whole GPU of a DRA node (``nvidia.com/gpu``, served there by the NVIDIA driver's
    class): the last resort of a small pod that no MIG slice or share holds, on DRA nodes
    only (a device-plugin node's whole GPUs stay for whole-GPU pods, as before). The
    smallest model whose GPU holds the memory; every model of that memory allowed.
    ``isolation: any`` only: the pod accepted any kind, and a whole GPU is one."""
    if ask.isolation is not Isolation.ANY:
        return None
    caps = [c for c in view.models.values()
            if c.whole_gpus and c.model.memory_mib >= ask.memory_mib
            and (c.whole_free or not need_free)]
    if not caps:
        return None
    smallest = min(c.model.memory_mib for c in caps)
    same = sorted((c for c in caps if c.model.memory_mib == smallest),
                  key=lambda c: c.model.name)
    models = tuple(c.model.name for c in same)
    free = sum(c.whole_free for c in same)
    why = (f"whole GPU of {'|'.join(models)} on a DRA node: no MIG slice or share holds "
           f"{gib(ask.memory_mib)}; "
           + (f"{free} free now" if free else "none free now, the pod waits for one"))
    return _sized(Kind.GPU, ask, why, A.GPU_RESOURCE, same, models)
