"""One Pod CREATE, end to end and pure: decide, build the patch, turn conflicts into denials.

Shared by the HTTP app, ``gpupack explain`` and the benchmark, so all three say the same.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, replace
from typing import Any

from packing.model import Snapshot
from webhook.capacity import ClusterView
from webhook.config import WebhookConfig
from webhook.decide import decide_admission
from webhook.decision import AdmissionDecision, Kind, deny
from webhook.patch import build_patch, records_warning, stale_records


@dataclass(frozen=True)
class Admission:
    decision: AdmissionDecision
    patch: tuple[dict[str, Any], ...]
    result: Mapping[str, Any]  # the pod as it will be stored (the input when denied)

    @property
    def allowed(self) -> bool:
        return self.decision.allowed

    @property
    def outcome(self) -> str:
        """Metrics label: denied | patched | unchanged | skipped (a pod gpupack does not
        handle and left as it came)."""
        if not self.decision.allowed:
            return "denied"
        if self.decision.kind is Kind.SKIP and not self.patch:
            return "skipped"
        return "patched" if self.patch else "unchanged"


def admit(
    pod: Any,
    cluster: ClusterView | Snapshot,
    config: WebhookConfig,
    namespace_labels: Mapping[str, str] | None = None,
    admission_id: str = "",
    live: Container[str] | None = None,
) -> Admission:
    """``admission_id``: the review's uid, written into a new decision (see
    :attr:`AdmissionDecision.admission`); a decision the pod already carries keeps its own
    when its id is in ``live`` (the webhook's claims in flight: a re-invocation of that
    admission). One whose id is not (a manifest copied from a running pod, replicas of a
    template built from one) is a new admission of the same slice: written with
    ``admission_id`` and left for the caller to claim (``decision.reused`` false).
    ``live`` None (``gpupack explain``): every carried decision is kept."""
    decision = decide_admission(pod, cluster, config, namespace_labels)
    stale = stale_records(pod) if decision.allowed else ()
    if stale:
        decision = replace(decision, strip=stale,
                           warnings=(*decision.warnings, records_warning(stale)))
    if not decision.allowed or (decision.kind is Kind.SKIP and not stale):
        return Admission(decision, (), pod if isinstance(pod, Mapping) else {})
    if (decision.reused and admission_id and live is not None
            and decision.admission not in live):
        decision = replace(decision, reused=False)
    if decision.claims and not decision.reused and admission_id:
        decision = replace(decision, admission=admission_id)
    built = build_patch(pod, decision, config)
    if built.conflicts:
        denied = deny(
            decision.klass,
            400,
            "gpupack would have to overwrite values set on the pod: " + "; ".join(built.conflicts),
            decision.warnings,
        )
        return Admission(denied, (), pod)
    return Admission(decision, built.ops, built.result)
