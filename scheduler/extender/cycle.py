"""One request's state, computed once and shared by the extension points and their
participants (kube-scheduler's ``CycleState``), and the protocol of a participant.

kube-scheduler gives each plugin of a scheduling cycle one ``CycleState``: what a plugin
computes about the pod is written there once and read by the others. gpupack's
extension points (:mod:`scheduler.extender.points`) do the same per HTTP request: the
pod of the request is read into a :class:`~packing.model.PodRequest` at most once
(:attr:`Cycle.req`), whoever asks first (the point remembering a pod for its bind, a
participant, the default verb), and a participant keeps what it works out about the pod
under its own name (:meth:`Cycle.read`).

A :class:`Participant` is a plugin at the extension points, as coscheduling is one in
kube-scheduler: each point asks the participants in order, and the first that answers
(anything but None) answers the request; a pod no participant claims gets the default
verbs (:mod:`scheduler.extender.verbs`). The LLM groups' participant is
:class:`scheduler.groups.plugin.GroupVerbs`; the command layer hands it in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kube.objects import ObjectError, pod_key, pod_request
from packing.model import Placement, PodRequest
from packing.status import Status
from scheduler.extender.wire import (
    ExtenderArgs,
    FilterResult,
    HostPriority,
    PreemptionArgs,
    PreemptionResult,
)

T = TypeVar("T")


class VerbError(ValueError):
    """Arguments the verb cannot work with (a pod it cannot read): HTTP 400."""


def read_pod(pod: Mapping[str, Any]) -> PodRequest:
    try:
        return pod_request(pod)
    except ObjectError as e:
        raise VerbError(str(e)) from None


@dataclass
class Cycle:
    """The state of one request about one pod: its object, its key, and its
    :class:`PodRequest` read at most once (a pod that cannot be read raises
    :class:`VerbError` each time it is asked for, at the first asker's point)."""

    pod: Mapping[str, Any]
    key: str
    _req: PodRequest | None = None
    _data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> Cycle:
        """The cycle of a filter, prioritize or preempt request's pod."""
        return cls(pod, pod_key(pod))

    @classmethod
    def known(cls, req: PodRequest) -> Cycle:
        """The cycle of a bind, whose pod gpupack already holds as a request."""
        return cls({}, req.key, req)

    @property
    def req(self) -> PodRequest:
        if self._req is None:
            self._req = read_pod(self.pod)
        return self._req

    def read(self, name: str, compute: Callable[[], T]) -> T:
        """What ``name`` (a participant) worked out about this pod, computed on first
        asking (CycleState's Read/Write)."""
        if name not in self._data:
            self._data[name] = compute()
        value: T = self._data[name]
        return value


class Participant(Protocol):
    """A plugin at the extension points. Each method answers the pods it owns and returns
    None for any other (the next participant, or the default verb, answers). ``filter``,
    ``prioritize`` and ``preempt`` run under the cache lock; ``reserve`` (the bind's
    choice of GPUs, assumed in the cache) and ``unreserve`` (a Binding the API refused:
    its claim undone) too."""

    def filter(self, args: ExtenderArgs, cycle: Cycle | None = None) -> FilterResult | None:
        ...

    def prioritize(self, args: ExtenderArgs, cycle: Cycle | None = None
                   ) -> list[HostPriority] | None:
        ...

    def preempt(self, args: PreemptionArgs, cycle: Cycle | None = None
                ) -> PreemptionResult | None:
        ...

    def reserve(self, pod: PodRequest, uid: str, node: str) -> Placement | Status | None:
        ...

    def unreserve(self, key: str) -> None:
        ...
