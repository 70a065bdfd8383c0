"""The real node agent (``nodeagent.Agent`` and its metrics) on the recorded fake NVML.

Run as a process by the Prometheus tests: ``python fake_agent.py PORT``. It serves the
agent's real ``/metrics`` on 127.0.0.1:PORT and ticks once a second. The GPUs are the
fake of ``tests/nodeagent`` (an H100 with MIG, a time-sliced L40S with three TTS pods,
a GPU fallen off the bus); the kubelet's PodResources view and the cgroup lookup are
fixed tables. One TTS pod leaks memory so growth and exhaustion series exist: its
memory rises 300 MiB per tick, and the agent's clock advances 30 s per tick (starting
15 minutes in the past), so a growth window fills in seconds. A fake, named as one.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "nodeagent"))

from fake_nvml import L40S_UUID, MIB, MIG_1G_A, MIG_3G, mixed_node
from prometheus_client import start_http_server

from nodeagent.agent import Agent, AgentConfig
from nodeagent.cgroups import CgroupOwner
from nodeagent.metrics import AgentMetrics
from nodeagent.nvml import NvmlAdapter
from nodeagent.podresources import DeviceAssignment, PodResourcesView, parse_device_id

STEP_S = 30.0  # agent seconds per tick
LEAK_BYTES = 300 * MIB  # per tick, by tts/tts-b


def _assign(ns: str, pod: str, resource: str, device: str) -> DeviceAssignment:
    return DeviceAssignment(ns, pod, "main", resource, parse_device_id(device))


VIEW = PodResourcesView(
    assignments=(
        _assign("llm", "vllm-0", "nvidia.com/mig-3g.40gb", MIG_3G),
        _assign("speech", "whisper-1", "nvidia.com/mig-1g.10gb", MIG_1G_A),
        _assign("speech", "tts-a", "nvidia.com/gpu.shared", f"{L40S_UUID}::0"),
        _assign("speech", "tts-b", "nvidia.com/gpu.shared", f"{L40S_UUID}::1"),
        _assign("speech", "tts-c", "nvidia.com/gpu.shared", f"{L40S_UUID}::2"),
    ),
    shared_uuids=frozenset({L40S_UUID}),
    allocatable_known=True,
)
CGROUPS = {5101: CgroupOwner("uid-a", "c1"), 5102: CgroupOwner("uid-b", "c2"),
           5103: CgroupOwner("uid-c", "c3")}
NAMES = {"uid-a": "speech/tts-a", "uid-b": "speech/tts-b", "uid-c": "speech/tts-c"}


@dataclass
class FixedPodResources:
    view: PodResourcesView

    def read(self) -> PodResourcesView:
        return self.view


class SimClock:
    def __init__(self) -> None:
        self.t = time.time() - 900.0

    def __call__(self) -> float:
        return self.t


def main(argv: list[str]) -> int:
    port = int(argv[1])
    fake = mixed_node()
    l40s = fake.gpus[1]
    leaker = next(p for p in l40s.processes if p.pid == 5102)
    clock = SimClock()
    metrics = AgentMetrics()
    agent = Agent(AgentConfig(node="gpu-node-1"), gpus=NvmlAdapter(fake),
                  podresources=FixedPodResources(VIEW), pod_of_pid=CGROUPS.get, clock=clock,
                  metrics=metrics, patch=None, pod_names=lambda: NAMES)
    start_http_server(port, addr="127.0.0.1", registry=metrics.registry)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop.is_set():
        agent.tick()
        clock.t += STEP_S
        if l40s.used_bytes + LEAK_BYTES < l40s.total_bytes - 1024 * MIB:
            assert leaker.used_bytes is not None
            leaker.used_bytes += LEAK_BYTES
            l40s.used_bytes += LEAK_BYTES
        stop.wait(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
