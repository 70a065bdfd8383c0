"""kube/objects.py against values the API server (or the node agent) lets through: a MIG
record that names no GPU, a node agent's memory past what its GPU model has, times that
are not RFC 3339 as the API server writes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kube.node_objects import node_info
from kube.objects import ObjectError, parse_time, recorded_placement, started_at
from packing.model import Placement


def bound_pod(ann: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "annotations": ann},
            "spec": {"nodeName": "n"}}


# ---- recorded placements: a MIG slice is on exactly one GPU ---------------------------------


@pytest.mark.parametrize(("ann", "want"), [
    ({"gpupack.io/gpus": "", "gpupack.io/mig": "1g.10gb@0"},
     "gpupack.io/mig='1g.10gb@0' needs exactly one GPU in gpupack.io/gpus, got ''"),
    ({"gpupack.io/gpus": " ", "gpupack.io/mig": "1g.10gb@0"}, "gpupack.io/gpus, got ' '"),
    ({"gpupack.io/gpus": "0,1", "gpupack.io/mig": "2g.20gb@2"},
     "gpupack.io/mig='2g.20gb@2' needs exactly one GPU in gpupack.io/gpus, got '0,1'"),
    # what is read
    ({"gpupack.io/gpus": "3", "gpupack.io/mig": "1g.10gb@4"},
     Placement("ml/p", "n", (3,), "1g.10gb", 4)),
    ({"gpupack.io/gpus": ""}, Placement("ml/p", "n", ())),
    ({"gpupack.io/gpus": "0,1"}, Placement("ml/p", "n", (0, 1))),
])
def test_a_mig_record_names_exactly_one_gpu(ann: dict[str, str],
                                            want: Placement | str) -> None:
    if isinstance(want, Placement):
        assert recorded_placement(bound_pod(ann), "n") == want
        return
    with pytest.raises(ObjectError) as e:
        recorded_placement(bound_pod(ann), "n")
    assert want in str(e.value), str(e.value)


def test_a_mig_placement_without_a_gpu_renders_instead_of_raising() -> None:
    # The cache logs an ignored placement with to_json: an IndexError there crashed it.
    p = Placement("ml/p", "n", (), "1g.10gb", 0)
    assert p.to_json()["mig"] == {"gpu": None, "profile": "1g.10gb", "start": 0}


# ---- the node agent's GPU memory: no more than the model has --------------------------------


def l40s_node(model: str, mem: int) -> dict[str, Any]:
    inv = {"v": 1, "node": "s1", "ts": 1,
           "gpus": [{"i": 0, "uuid": "GPU-1", "model": model, "mem": mem, "used": 0,
                     "mode": "shared"}]}
    return {"metadata": {"name": "s1",
                         "labels": {"nvidia.com/gpu.product": "NVIDIA-L40S",
                                    "nvidia.com/gpu.replicas": "4"},
                         "annotations": {"gpupack.io/inventory": json.dumps(inv)}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi",
                                       "nvidia.com/gpu.shared": "4"}}}


@pytest.mark.parametrize(("model", "mem", "taken"), [
    ("NVIDIA-L40S", 46068, True),  # what NVML reports for an L40S
    ("NVIDIA-L40S", 49152 * 110 // 100, True),  # the catalog's 49,152 MiB + 10%
    ("NVIDIA-L40S", 49152 * 110 // 100 + 1, False),
    ("NVIDIA-L40S", 900 * 1024, False),  # a 900 GiB L40S
    ("NVIDIA-H100-80GB-HBM3", 81559, True),
    ("NVIDIA-H100-80GB-HBM3", 200_000, False),
    ("NVIDIA-GH200-144G-HBM3e", 146081, True),  # read as an H200-141GB: +1.2%
    ("NVIDIA-RTX-PRO-6000-Blackwell", 97887, True),  # not in the catalog: its own figure
    ("NVIDIA-RTX-PRO-6000-Blackwell", 1 << 20, True),  # 1 TiB: the hard cap
])
def test_a_gpu_reported_with_more_memory_than_its_model_has_is_not_taken(
        model: str, mem: int, taken: bool) -> None:
    notes: list[str] = []
    (gpu,) = node_info(l40s_node(model, mem), notes).gpus
    assert (not gpu.inferred) is taken
    if taken:
        assert gpu.memory_mib == mem and notes == []
    else:  # noted, naming the field and the value; the node's own figures are used
        assert gpu.memory_mib == 49152
        assert "gpus[0].mem" in notes[0] and str(mem) in notes[0] and "inferred instead" in \
            notes[0]


# ---- times: RFC 3339 as the API server writes it --------------------------------------------


@pytest.mark.parametrize(("value", "epoch"), [
    ("2026-01-01T00:00:00Z", 1767225600.0),
    ("2026-01-01T00:00:00.5Z", 1767225600.5),
    ("2026-01-01T00:00:00.123456Z", 1767225600.123456),  # a MicroTime
    ("2026-01-01T00:00:00+05:30", 1767225600.0 - 5.5 * 3600),
    ("2026-01-01T00:00:00-01:00", 1767225600.0 + 3600),
    ("2026-01-01T00:00:00.000000001Z", 1767225600.000000001),
    # not a time the API server writes: None
    ("2026-01-01T00:00:00", None),  # no zone: would be read in this process's local time
    ("2026-01-01", None),  # a date alone
    ("2026-W01-1", None),  # an ISO week date
    ("2026-01-01 00:00:00Z", None),  # a space for the T
    ("20260101T000000Z", None),  # ISO 8601 basic form
    ("2026-01-01T00:00Z", None),  # no seconds
    ("2026-01-01T00:00:00ZZ", None),
    ("2026-01-01T00:00:00+0530", None),  # an offset without its colon
    ("2026-01-01T00:00:00+24:00", None),
    ("2026-01-01T00:00:00+05:60", None),
    ("2026-01-01T25:00:00Z", None),
    ("2026-13-01T00:00:00Z", None),
    ("2026-01-01T00:00:00.Z", None),
    ("2026-01-01T00:00:00.1234567890Z", None),  # finer than nanoseconds
    ("\u0662\u0660\u0662\u0666-01-01T00:00:00Z", None),  # digits that are not ASCII
    (" 2026-01-01T00:00:00Z", None),
    ("2026-01-01T00:00:00Z\n", None),
    ("", None),
    (None, None), (1700000000, None), (1.5, None), ([], None), ({"a": 1}, None),
])
def test_times_are_rfc3339_as_the_api_server_writes_them(value: object,
                                                         epoch: float | None) -> None:
    if epoch is None:
        assert parse_time(value) is None
    else:
        assert parse_time(value) == pytest.approx(epoch, abs=1e-6)


@pytest.mark.parametrize("pod", [
    None, [], "x", 5,
    {"status": None}, {"status": []}, {"status": {"startTime": 5}},
    {"status": {"startTime": "2026-01-01T00:00:00"}},
])
def test_started_at_of_what_is_not_a_started_pod_is_none(pod: object) -> None:
    assert started_at(pod) is None
