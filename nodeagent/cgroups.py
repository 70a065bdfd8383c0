"""Which pod a process belongs to, from ``/proc/<pid>/cgroup``.

NVML names GPU processes by host PID only. The kubelet puts every container in a cgroup
whose path carries the pod UID and the container id, whatever the layout:

* systemd driver (cgroup v1 or v2), containerd / CRI-O / Docker::

    0::/kubepods.slice/kubepods-burstable.slice/
       kubepods-burstable-pod<uid with _>.slice/cri-containerd-<id>.scope
    0::/kubepods.slice/kubepods-pod<uid>.slice/crio-<id>.scope        (Guaranteed)

* cgroupfs driver::

    12:memory:/kubepods/burstable/pod<uid>/<id>

Only the path components are matched, never the prefix: an agent in its own cgroup
namespace sees paths like ``0::/../../kubepods-...slice/...``, and kind / nested setups
prefix ``/kubelet.slice/kubelet-kubepods.slice``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# Pod UIDs are UUIDs (dashes, written with underscores inside systemd unit names); static
# pods use the 32-hex config hash instead.
_POD = re.compile(
    r"(?:^|[-])pod("
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$"
)
# A container id is 64 hex chars, bare (cgroupfs) or in a runtime's systemd scope.
_CONTAINER = re.compile(r"^(?:cri-containerd-|crio-|docker-|cri-dockerd-)?([0-9a-f]{64})"
                        r"(?:\.scope)?$")


@dataclass(frozen=True)
class CgroupOwner:
    """A process's pod UID (with dashes, as in ``metadata.uid``) and container id (None
    for a pod-level process such as CRI-O's ``crio-conmon-`` monitor)."""

    pod_uid: str
    container_id: str | None


def parse_cgroup_path(path: str) -> CgroupOwner | None:
    """The pod of one cgroup path, or None when it is not under a kubepods hierarchy."""
    pod_uid: str | None = None
    container: str | None = None
    for part in path.split("/"):
        m = _POD.search(part)
        if m:
            pod_uid = m.group(1).replace("_", "-")
            container = None  # a container is only a component *below* its pod
            continue
        if pod_uid is not None:
            c = _CONTAINER.match(part)
            if c:
                container = c.group(1)
    if pod_uid is None:
        return None
    return CgroupOwner(pod_uid, container)


def parse_cgroup_file(text: str) -> CgroupOwner | None:
    """The pod of a whole ``/proc/<pid>/cgroup`` file (v1: one line per hierarchy, v2:
    the single ``0::`` line). The first line naming a pod and a container wins; v1
    hierarchies all agree for kubelet-managed processes."""
    fallback: CgroupOwner | None = None
    for line in text.splitlines():
        # hierarchy-ID:controller-list:cgroup-path; the path itself may contain ':'.
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        ref = parse_cgroup_path(fields[2].strip())
        if ref is None:
            continue
        if ref.container_id is not None:
            return ref
        fallback = fallback or ref
    return fallback


def pod_of_pid(pid: int, proc_root: str | Path = "/proc") -> CgroupOwner | None:
    """Read and parse ``<proc_root>/<pid>/cgroup``; None when the process is gone or not
    in a pod (races with process exit are normal here)."""
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text(encoding="utf-8",
                                                                  errors="replace")
    except OSError:
        return None
    return parse_cgroup_file(text)
