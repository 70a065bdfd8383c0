"""The webhook's decision for one pod, as a value (:class:`AdmissionDecision`: its kind,
what the patch writes, the claim it makes), and the two errors a pod's input raises on
the way to it: :class:`PodError` (a field that cannot be read) and :class:`Conflict` (a
value the user set that the decision would overwrite), both 400 denials naming the
field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from webhook.capacity import Claim, ShareKind
from webhook.sizing import (
    ArgEdit,
)


class Kind(StrEnum):
    SKIP = "skip"  # not a GPU pod gpupack handles: untouched
    WHOLE = "whole"  # whole GPUs: only the scheduler name
    EXPLICIT = "explicit"  # names a MIG/shared resource itself: only the scheduler name
    MIG = "mig"
    SHARED = "shared"  # a time-sliced share
    MPS = "mps"  # an MPS replica (the share resource, pinned to MPS nodes)
    GPU = "gpu"  # a whole GPU of a DRA node, the last resort of a small pod there
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
        return self.kind in (Kind.MIG, Kind.SHARED, Kind.MPS, Kind.GPU)

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
        elif self.kind is Kind.GPU:
            doc["resource"] = self.resource
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
        if self.kind is Kind.GPU:
            return Claim(ShareKind.GPU, self.models, self.memory_mib, self.compute_milli,
                         reach=self.reach)
        return None


class PodError(ValueError):
    """A pod field the webhook cannot read: becomes a 400 denial naming the field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


class Conflict(ValueError):
    """A value the user set explicitly that the decision would have to overwrite."""

    def __init__(self, field: str, problem: str) -> None:
        sep = "" if problem.startswith("=") else " "
        super().__init__(f"{field}{sep}{problem}")


def deny(klass: str, code: int, message: str, warnings: Sequence[str] = ()) -> AdmissionDecision:
    return AdmissionDecision(Kind.DENY, klass, message, status_code=code, warnings=tuple(warnings))
