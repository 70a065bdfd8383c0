"""The webhook's admission in a replay (``gpupack simulate``): the pod as it is stored.

The day replay (:mod:`packing.day`) creates pods one at a time; with gpupack installed
each goes through the webhook first. :func:`webhook_admission` is that step for the
replay: the same decision and patch the webhook serves (:func:`webhook.admit.admit`),
on the view of the replayed cluster at that moment (its running pods, and the pods
waiting for the scheduler as claims, as :meth:`ClusterView.of` counts them), and the
patched pod read back as the scheduler reads it (:func:`kube.objects.pod_request`). A
denial is returned as its reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kube.objects import ObjectError, pod_request
from packing.day import DayPod
from packing.model import PodRequest
from packing.state import ClusterState
from webhook.admit import admit
from webhook.capacity import ClusterView
from webhook.config import WebhookConfig

Admission = Callable[[DayPod, ClusterState, Sequence[PodRequest]], PodRequest | str]


def webhook_admission(config: WebhookConfig | None = None) -> Admission:
    """An admission function for :class:`packing.policies.placers.GpupackPlacer`."""
    cfg = config or WebhookConfig()

    def admission(pod: DayPod, state: ClusterState,
                  pending: Sequence[PodRequest]) -> PodRequest | str:
        if pod.manifest is None:
            return pod.request
        view = ClusterView.of_state(state, pending)
        done = admit(pod.manifest, view, cfg)
        if not done.allowed:
            return f"denied by the webhook: {done.decision.reason}"
        try:
            return pod_request(done.result)
        except ObjectError as e:
            return f"the webhook's pod cannot be read: {e}"

    return admission
