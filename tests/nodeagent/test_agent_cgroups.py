"""Process -> pod from /proc/<pid>/cgroup, table-driven with real-looking lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.cgroups import CgroupOwner, parse_cgroup_file, parse_cgroup_path, pod_of_pid

UID = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
UID_ = UID.replace("-", "_")
CID = "4f8a1c2e9b7d6a5f3e2d1c0b9a8f7e6d5c4b3a29180f7e6d5c4b3a2918a7b6c5"
STATIC = "5a9ef4a0c7e7a3bfa3f6e5a1b2c3d4e5"

CASES: list[tuple[str, str, CgroupOwner | None]] = [
    ("v2 systemd containerd burstable",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("v2 systemd containerd besteffort",
     f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
     f"cri-containerd-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("v2 systemd guaranteed (no QoS slice)",
     f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("v2 systemd CRI-O",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"crio-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("v2 CRI-O conmon is pod-level",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
     f"crio-conmon-{CID}.scope\n",
     CgroupOwner(UID, None)),
    ("v2 cgroupfs driver",
     f"0::/kubepods/burstable/pod{UID}/{CID}\n",
     CgroupOwner(UID, CID)),
    ("v2 seen from a private cgroup namespace",
     f"0::/../../kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("kind: kubelet nested under kubelet.slice",
     f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("v1 cgroupfs, many hierarchies",
     "12:hugetlb:/kubepods/besteffort/pod" + UID + "/" + CID + "\n"
     "11:memory:/kubepods/besteffort/pod" + UID + "/" + CID + "\n"
     "10:devices:/kubepods/besteffort/pod" + UID + "/" + CID + "\n"
     "1:name=systemd:/kubepods/besteffort/pod" + UID + "/" + CID + "\n",
     CgroupOwner(UID, CID)),
    ("v1 systemd with docker, hybrid 0:: line first",
     "0::/\n"
     f"7:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/"
     f"kubepods-burstable-pod{UID_}.slice/docker-{CID}.scope\n",
     CgroupOwner(UID, CID)),
    ("static pod hash uid",
     f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice/"
     f"cri-containerd-{CID}.scope\n",
     CgroupOwner(STATIC, CID)),
    ("host process", "0::/system.slice/containerd.service\n", None),
    ("user session", "0::/user.slice/user-1000.slice/session-3.scope\n", None),
    ("empty", "", None),
    ("garbage", "not a cgroup line\n", None),
]


@pytest.mark.parametrize(("text", "expected"), [(t, e) for _, t, e in CASES],
                         ids=[n for n, _, _ in CASES])
def test_parse_cgroup_file(text: str, expected: CgroupOwner | None) -> None:
    assert parse_cgroup_file(text) == expected


def test_container_must_sit_below_the_pod() -> None:
    assert parse_cgroup_path(f"/{CID}/kubepods/burstable/pod{UID}") == CgroupOwner(UID, None)


def test_pod_of_pid_reads_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4101").mkdir()
    (tmp_path / "4101" / "cgroup").write_text(
        f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    assert pod_of_pid(4101, tmp_path) == CgroupOwner(UID, CID)
    assert pod_of_pid(4242, tmp_path) is None  # process exited between NVML and /proc
