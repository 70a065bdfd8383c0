"""What a Pod asks of Dynamic Resource Allocation, read from its object and the cache's
DRA objects: its claims in ``spec.resourceClaims`` order, and the extended resources a
DeviceClass serves (KEP-5004).

kube-scheduler's DynamicResources PreFilter resolves each ``spec.resourceClaims`` entry:
``resourceClaimName`` names the claim; ``resourceClaimTemplateName`` stands for the claim
the resourceclaim controller made from the template, named in the pod's
``status.resourceClaimStatuses``. The scheduler calls the extender only after PreFilter
found every claim, so a claim the cache has not seen means gpupack's watch is behind
(:attr:`PodClaims.behind`), except that a claim made from a template the cache knows is
the template's claim under its generated name (the controller copies the spec).

The claim kube-scheduler makes for DRA-backed extended resources exists in the API only
after PreBind; before, it is the claim :func:`packing.dra.extended.extended_resource_claim`
makes on each node whose allocatable lacks the resource. Its key, while in flight, is
``<namespace>/<pod>#extended-resources`` (:data:`kube.dra_store.EXTENDED_MARK`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kube.dra_store import EXTENDED_MARK, DraObjects
from packing.dra.extended import (
    Container,
    ExtendedClaim,
    class_for,
    containers_from_pod,
    extended_resource_claim,
)
from packing.dra.objects import DeviceClass, ResourceClaim


@dataclass(frozen=True)
class PodClaims:
    """A pod's DRA needs: ``own``: (claim key, claim) per ``spec.resourceClaims`` entry,
    in order (the claim may be allocated already); ``containers`` and ``extended``: the
    extended resources it asks that a DeviceClass serves, by name; ``made``: the claim
    kube-scheduler made for those, once the API has it. ``behind``: why gpupack's view
    cannot answer yet (a claim not seen); ``error``: why the pod cannot be read."""

    namespace: str
    name: str
    uid: str
    own: tuple[tuple[str, ResourceClaim], ...] = ()
    containers: tuple[Container, ...] = ()
    extended: tuple[str, ...] = ()
    made: ResourceClaim | None = None
    behind: str = ""
    error: str = ""
    entries: int = 0  # spec.resourceClaims entries, seen or not

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def extended_key(self) -> str:
        return f"{self.key}{EXTENDED_MARK}"

    @property
    def uses_dra(self) -> bool:
        return bool(self.entries or self.own or self.extended or self.error)

    def to_allocate(self, classes: Sequence[DeviceClass], device_plugin: bool
                    ) -> tuple[list[tuple[str, ResourceClaim]], str]:
        """(claim key, claim) of the claims the allocator allocates on a node, in its
        order (the pod's unallocated claims, then the extended-resource claim), and the
        extended resource the node neither serves by DRA nor advertises ("" when none).
        ``device_plugin``: the node's allocatable has the pod's extended resources (the
        device plugin serves them there)."""
        out = [(k, c) for k, c in self.own if c.allocation is None]
        if not self.extended:
            return out, ""
        if self.made is not None:
            if self.made.allocation is None:
                out.append((self.made.key, self.made))
            return out, ""
        allocatable = {r: 1 for r in self.extended} if device_plugin else {}
        made: ExtendedClaim = extended_resource_claim(self.namespace, self.name,
                                                      self.containers, classes, allocatable)
        if made.misfit:
            return out, made.misfit
        if made.claim is not None:
            out.append((self.extended_key, made.claim))
        return out, ""


def _meta(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    return (str(meta.get("namespace") or "default"), str(meta.get("name") or ""),
            str(meta.get("uid") or ""))


def read_pod_claims(pod: Mapping[str, Any], dra: DraObjects) -> PodClaims:
    """The pod's DRA needs as the cache's objects resolve them (see the module
    docstring). Never raises: a malformed field is :attr:`PodClaims.error`."""
    ns, name, uid = _meta(pod)
    out = PodClaims(ns, name, uid)
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    assert isinstance(spec, Mapping) and isinstance(status, Mapping)
    entries = spec.get("resourceClaims") or []
    if not isinstance(entries, list):
        return replace(out, error="spec.resourceClaims: not a list", entries=1)
    generated: dict[str, str] = {}
    for s in status.get("resourceClaimStatuses") or []:
        if isinstance(s, Mapping) and isinstance(s.get("name"), str) and isinstance(
                s.get("resourceClaimName"), str):
            generated[s["name"]] = s["resourceClaimName"]
    out = replace(out, entries=len(entries))
    own: list[tuple[str, ResourceClaim]] = []
    behind = ""
    for i, e in enumerate(entries):
        if not isinstance(e, Mapping) or not isinstance(e.get("name"), str):
            return replace(out, error=f"spec.resourceClaims[{i}]: no name")
        claim_name = e.get("resourceClaimName")
        template = e.get("resourceClaimTemplateName")
        if isinstance(claim_name, str) and claim_name:
            key = f"{ns}/{claim_name}"
            claim = dra.claim(key)
            if claim is None:
                behind = behind or f"ResourceClaim {key} not seen yet"
                continue
            own.append((key, claim))
        elif isinstance(template, str) and template:
            made = generated.get(e["name"])
            claim = dra.claim(f"{ns}/{made}") if made else None
            if claim is None:
                t = dra.templates.get(f"{ns}/{template}")
                if t is None:
                    behind = behind or (f"ResourceClaimTemplate {ns}/{template} (and its "
                                        "claim) not seen yet")
                    continue
                claim = replace(t, name=made or f"{name}-{e['name']}")
            own.append((claim.key, claim))
        else:
            return replace(out, error=f"spec.resourceClaims[{i}]: neither resourceClaimName "
                                      "nor resourceClaimTemplateName")
    try:
        containers = tuple(containers_from_pod(pod))
    except ValueError as e:
        return replace(out, error=str(e))
    classes = list(dra.classes.values())
    wanted = sorted({r for c in containers for r, n in c.requests.items()
                     if n and class_for(r, classes) is not None})
    made_claim = None
    if wanted:
        ext = status.get("extendedResourceClaimStatus")
        made_name = ext.get("resourceClaimName") if isinstance(ext, Mapping) else None
        if isinstance(made_name, str) and made_name:
            made_claim = dra.claim(f"{ns}/{made_name}")
        if made_claim is None:
            made_claim = dra.extended_claim_of(f"{ns}/{name}")
    return replace(out, own=tuple(own), containers=containers, extended=tuple(wanted),
                   made=made_claim, behind=behind)
