"""Which pod holds which GPU device: the kubelet PodResources API (v1) over its Unix
socket.

Device plugin ids come in three shapes and all are resolved to a physical GPU UUID:

* a whole GPU: ``GPU-<uuid>``;
* a MIG device: ``MIG-<uuid>`` (mixed and single strategies alike);
* a time-sliced (or MPS) replica: ``GPU-<uuid>::<replica>`` or ``MIG-<uuid>::<replica>``,
  the NVIDIA device plugin's annotated id.

``GetAllocatableResources`` additionally tells which GPUs the plugin shares at all,
even when no pod holds a replica yet. Older kubelets lack it; that is not an error.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import grpc

from packing.model import is_pod_key

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
NVIDIA_RESOURCE_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-")

# The generated modules are untyped (and excluded from mypy); loading them by name keeps
# their Any-typed surface from leaking type errors into this module.
_pb2: Any = importlib.import_module("nodeagent.proto.podresources_pb2")
_pb2_grpc: Any = importlib.import_module("nodeagent.proto.podresources_pb2_grpc")


@dataclass(frozen=True)
class DeviceId:
    """A device plugin id split into the NVIDIA UUID and the replica (None if not
    shared)."""

    raw: str
    uuid: str
    replica: int | None

    @property
    def is_mig(self) -> bool:
        return self.uuid.startswith("MIG-")


def parse_device_id(raw: str) -> DeviceId:
    uuid, sep, rest = raw.partition("::")
    replica: int | None = None
    if sep:
        try:
            replica = int(rest)
        except ValueError:
            replica = None  # an unknown annotation: keep the UUID, drop the suffix
    return DeviceId(raw=raw, uuid=uuid, replica=replica)


@dataclass(frozen=True)
class DeviceAssignment:
    """One NVIDIA device held by one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device: DeviceId

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True)
class PodResourcesView:
    """What the kubelet says about NVIDIA devices on this node."""

    assignments: tuple[DeviceAssignment, ...] = ()
    # UUIDs (GPU or MIG) the plugin advertises as replicas: time-sliced / MPS shared.
    shared_uuids: frozenset[str] = frozenset()
    allocatable_known: bool = False  # GetAllocatableResources answered
    error: str | None = None

    def with_ids(self, ids: Mapping[str, str]) -> PodResourcesView:
        """The view with device ids found in ``ids`` replaced by what they map to: the
        device plugin's index ids (``deviceIDStrategy: index``) by the UUIDs NVML gives
        the same devices. The error about unrecognised ids is recomputed."""
        if not any(a.device.uuid in ids for a in self.assignments) and not any(
                u in ids for u in self.shared_uuids):
            return self
        assignments = tuple(
            replace(a, device=replace(a.device, uuid=ids[a.device.uuid]))
            if a.device.uuid in ids else a for a in self.assignments)
        error = self.error
        if error is not None and error == unrecognised_ids(self.assignments):
            error = unrecognised_ids(assignments)
        return replace(self, assignments=assignments,
                       shared_uuids=frozenset(ids.get(u, u) for u in self.shared_uuids),
                       error=error)

    def pods_by_uuid(self) -> dict[str, tuple[str, ...]]:
        """UUID (GPU or MIG) -> sorted pod keys holding it or a replica of it."""
        out: dict[str, set[str]] = {}
        for a in self.assignments:
            out.setdefault(a.device.uuid, set()).add(a.pod_key)
        return {u: tuple(sorted(p)) for u, p in out.items()}


def _is_nvidia(resource: str) -> bool:
    return resource.startswith(NVIDIA_RESOURCE_PREFIXES)


def assignments_from_list(response: Any) -> tuple[DeviceAssignment, ...]:
    """Flatten a ``ListPodResourcesResponse`` to the NVIDIA devices it assigns."""
    found: list[DeviceAssignment] = []
    for pod in response.pod_resources:
        # The only pod key the inventory decoder takes: one bad key makes the whole
        # annotation undecodable.
        if not is_pod_key(f"{pod.namespace}/{pod.name}"):
            # No pod key to publish it under (the inventory would not decode).
            log.warning("PodResources: pod namespace=%.60r name=%.60r is not a pod key; its "
                        "devices are not attributed", pod.namespace, pod.name)
            continue
        for container in pod.containers:
            for dev in container.devices:
                if not _is_nvidia(dev.resource_name):
                    continue
                found.extend(
                    DeviceAssignment(pod.namespace, pod.name, container.name,
                                     dev.resource_name, parse_device_id(d))
                    for d in dev.device_ids)
    return tuple(found)


def unrecognised_ids(assignments: Iterable[DeviceAssignment]) -> str | None:
    """Say so when device ids are not NVIDIA UUIDs (the device plugin's
    ``deviceIDStrategy: index``): their pods cannot be matched to GPUs, so their memory
    is not attributed and MIG owners stay unknown."""
    odd = sorted({a.device.uuid for a in assignments
                  if not a.device.uuid.startswith(("GPU-", "MIG-"))})
    if not odd:
        return None
    return (f"PodResources: {len(odd)} device id(s) are not GPU/MIG UUIDs (e.g. "
            f"{odd[0][:40]!r}; deviceIDStrategy must be uuid): their pods are not matched "
            f"to GPUs")


def shared_from_allocatable(devices: Iterable[Any]) -> frozenset[str]:
    return frozenset(
        parsed.uuid
        for dev in devices if _is_nvidia(dev.resource_name)
        for parsed in map(parse_device_id, dev.device_ids) if parsed.replica is not None)


class PodResourcesClient:
    """A small client of the kubelet socket; one channel, reused across intervals."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._last_detail: str | None = None
        # The last GetAllocatableResources answer's shared GPUs: a transient failure of
        # that call must not turn an idle time-sliced GPU into a "whole" one.
        self._last_shared: frozenset[str] | None = None

    def _connect(self) -> Any:
        if self._stub is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
            self._stub = _pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def read(self) -> PodResourcesView:
        """Never raises for kubelet trouble: the view carries the error instead, so the
        agent still reports NVML data when the socket is missing or slow."""
        stub = self._connect()
        try:
            listed = stub.List(_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            # The inventory carries only the status code: gRPC's detail text varies
            # between attempts and would make every interval look like a change worth a
            # Node patch. The detail goes to the log, once per distinct message.
            code, detail = _rpc_error(e)
            if f"{code}: {detail}" != self._last_detail:
                log.warning("PodResources List on %s failed: %s: %s", self.socket_path, code,
                            detail)
                self._last_detail = f"{code}: {detail}"
            return PodResourcesView(error=f"PodResources List: {code}")
        self._last_detail = None
        assignments = assignments_from_list(listed)
        try:
            alloc = stub.GetAllocatableResources(_pb2.AllocatableResourcesRequest(),
                                                 timeout=self.timeout_s)
        except grpc.RpcError as e:
            code, detail = _rpc_error(e)
            assigned = frozenset(a.device.uuid for a in assignments
                                 if a.device.replica is not None)
            if code != "UNIMPLEMENTED" and self._last_shared is not None:
                # A transient failure: keep what the last answer said, and say so.
                log.debug("GetAllocatableResources failed: %s: %s", code, detail)
                return PodResourcesView(
                    assignments=assignments, shared_uuids=self._last_shared | assigned,
                    error=f"PodResources GetAllocatableResources: {code}")
            # Unimplemented before the GetAllocatable feature went GA (1.28), or failing
            # from the start: infer sharing from the replica ids of assigned devices only.
            log.debug("GetAllocatableResources unavailable: %s: %s", code, detail)
            return PodResourcesView(assignments=assignments, shared_uuids=assigned,
                                    error=unrecognised_ids(assignments))
        self._last_shared = shared_from_allocatable(alloc.devices)
        shared = self._last_shared | frozenset(
            a.device.uuid for a in assignments if a.device.replica is not None)
        return PodResourcesView(assignments=assignments, shared_uuids=shared,
                                allocatable_known=True, error=unrecognised_ids(assignments))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None


def _rpc_error(e: grpc.RpcError) -> tuple[str, str]:
    """(status code name, detail text) of a failed call."""
    if isinstance(e, grpc.Call):
        code = e.code()
        return (code.name if code is not None else "UNKNOWN"), str(e.details())
    return "UNKNOWN", str(e)
