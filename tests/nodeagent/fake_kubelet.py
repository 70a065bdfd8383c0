"""A fake kubelet: the real PodResources v1 gRPC service, served on a Unix socket, with
answers the tests set."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from nodeagent.proto import podresources_pb2 as pb
from nodeagent.proto import podresources_pb2_grpc as pb_grpc


@dataclass
class KubeletState:
    """What the fake kubelet answers; tests mutate it between calls."""

    pods: list[tuple[str, str, list[tuple[str, list[tuple[str, list[str]]]]]]] = field(
        default_factory=list)  # (namespace, name, [(container, [(resource, ids)])])
    allocatable: list[tuple[str, list[str]]] = field(default_factory=list)
    allocatable_implemented: bool = True
    allocatable_unavailable: bool = False  # a transient failure of GetAllocatableResources
    list_calls: int = 0


class PodResourcesServicer(pb_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, state: KubeletState) -> None:
        self.state = state

    def List(self, request: Any, context: Any) -> Any:
        self.state.list_calls += 1
        return pb.ListPodResourcesResponse(pod_resources=[
            pb.PodResources(name=name, namespace=ns, containers=[
                pb.ContainerResources(name=cname, devices=[
                    pb.ContainerDevices(resource_name=res, device_ids=ids,
                                        topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)]))
                    for res, ids in devices])
                for cname, devices in containers])
            for ns, name, containers in self.state.pods])

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        if not self.state.allocatable_implemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        if self.state.allocatable_unavailable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "kubelet restarting")
        return pb.AllocatableResourcesResponse(devices=[
            pb.ContainerDevices(resource_name=res, device_ids=ids)
            for res, ids in self.state.allocatable])


