"""The node agent's real command (``gpupack agent``) with its two test doubles: the
recorded fake NVML of ``tests/nodeagent`` (an H100 with MIG, a time-sliced L40S, a GPU
fallen off the bus) in place of ``pynvml``, and the fake kubelet's real PodResources gRPC
service on a Unix socket. Everything else, the Node patch through the API server with
the agent's own ServiceAccount token included, is the shipped code.

    python agent_double.py --socket-dir DIR -- <gpupack agent arguments>
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent import futures
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "nodeagent"))

import grpc  # noqa: E402
from fake_kubelet import KubeletState, PodResourcesServicer  # noqa: E402
from fake_nvml import H100_UUID, L40S_UUID, mixed_node  # noqa: E402

import nodeagent.nvml  # noqa: E402
from gpupack import agent_cmd  # noqa: E402
from nodeagent.proto import podresources_pb2_grpc as pb_grpc  # noqa: E402

# Which devices the fake kubelet says pods hold: a test writes this JSON file in the
# socket folder, [[namespace, pod, [[container, [[resource, [device id, ...]], ...]]]]],
# and every PodResources List reads it again (no file: no pod holds a device).
PODS_FILE = "pods.json"


class ScriptedServicer(PodResourcesServicer):  # type: ignore[misc]
    def __init__(self, state: KubeletState, pods_file: Path) -> None:
        super().__init__(state)
        self.pods_file = pods_file

    def List(self, request: Any, context: Any) -> Any:
        try:
            raw = json.loads(self.pods_file.read_text())
        except (OSError, ValueError):
            raw = []
        self.state.pods = [(ns, name, [(c, [(r, list(ids)) for r, ids in devices])
                                       for c, devices in containers])
                           for ns, name, containers in raw]
        return super().List(request, context)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="agent_double.py")
    p.add_argument("--socket-dir", type=Path, required=True)
    p.add_argument("agent_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    rest = [a for a in args.agent_args if a != "--"]
    args.socket_dir.mkdir(parents=True, exist_ok=True)
    socket = args.socket_dir / "kubelet.sock"
    socket.unlink(missing_ok=True)
    state = KubeletState(allocatable=[
        ("nvidia.com/gpu.shared", [f"{L40S_UUID}::{i}" for i in range(4)]),
        ("nvidia.com/gpu", [H100_UUID]),
    ])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_PodResourcesListerServicer_to_server(
        ScriptedServicer(state, args.socket_dir / PODS_FILE), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    fake = mixed_node()
    nodeagent.nvml.load_default = lambda: nodeagent.nvml.NvmlAdapter(fake)
    # A /proc for the fake's GPU processes: each in a pod's cgroup (UIDs no pod has), so
    # the agent looks their pods up through the API server, as on a real node.
    proc = args.socket_dir / "proc"
    for gpu in fake.gpus:
        for process in gpu.processes:
            d = proc / str(process.pid)
            d.mkdir(parents=True, exist_ok=True)
            uid = f"00000000-0000-4000-8000-{process.pid:012d}"
            (d / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/"
                f"cri-containerd-{process.pid:064x}.scope\n")
    try:
        return agent_cmd.main(["--podresources-socket", str(socket), "--proc-root", str(proc),
                               *rest])
    finally:
        server.stop(grace=None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
