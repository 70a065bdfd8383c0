"""openb trace parsing: good rows, bad rows (line/column/value), snapshot mapping."""

from __future__ import annotations

import pytest

from packing.model import GpuMode, RequestKind
from sim.traces import (
    OpenbNode,
    OpenbPod,
    TraceError,
    parse_nodes,
    parse_pods,
    to_pod_request,
    to_snapshot_nodes,
)

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def test_parse_nodes() -> None:
    nodes = parse_nodes(NODE_HEADER + "n0,64000,262144,2,P100\nn1,96000,393216,8,G2\n")
    assert nodes == (
        OpenbNode("n0", 64000, 262144, 2, "P100"),
        OpenbNode("n1", 96000, 393216, 8, "G2"),
    )


def test_parse_pods_full_and_short_columns() -> None:
    full = parse_pods(POD_HEADER + "p0,6000,12288,1,460,V100M16|V100M32,LS,Running,0,1,0\n")
    assert full == (OpenbPod("p0", 6000, 12288, 1, 460, frozenset({"V100M16", "V100M32"})),)
    short = parse_pods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np1,88000,1,8,1000\n")
    assert short == (OpenbPod("p1", 88000, 1, 8, 1000, frozenset()),)


@pytest.mark.parametrize(
    ("row", "line", "column", "value"),
    [
        ("p0,abc,1,1,1000,,LS,Running,0,1,0", 2, "cpu_milli", "abc"),
        ("p0,1,-5,1,1000,,LS,Running,0,1,0", 2, "memory_mib", "-5"),
        ("p0,1,1,0,500,,LS,Running,0,1,0", 2, "gpu_milli", "500"),
        ("p0,1,1,1,0,,LS,Running,0,1,0", 2, "gpu_milli", "0"),
        ("p0,1,1,2,500,,LS,Running,0,1,0", 2, "gpu_milli", "500"),
        ("p0,1,1,1,1200,,LS,Running,0,1,0", 2, "gpu_milli", "1200"),
        ("p0,1,1,1,500,H100,LS,Running,0,1,0", 2, "gpu_spec", "H100"),
        (",1,1,1,500,,LS,Running,0,1,0", 2, "name", ""),
    ],
)
def test_bad_pod_rows(row: str, line: int, column: str, value: str) -> None:
    with pytest.raises(TraceError) as ei:
        parse_pods(POD_HEADER + row + "\n")
    assert (ei.value.line, ei.value.column, ei.value.value) == (line, column, value)
    assert f"line {line}" in str(ei.value)


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        (NODE_HEADER + "n0,64000,262144,2,P100\nn1,1,1,x,G2\n", 3, "gpu"),
        (NODE_HEADER + "n0,64000,262144,2,B200\n", 2, "model"),
        (NODE_HEADER + "n0,1,1,1,G2\nn0,1,1,1,G2\n", 3, "sn"),
        (NODE_HEADER + "n0,1,1,1,G2,extra\n", 2, "<extra>"),
        ("sn,cpu_milli,memory_mib,model\nn0,1,1,G2\n", 1, "gpu"),
    ],
)
def test_bad_node_rows(text: str, line: int, column: str) -> None:
    with pytest.raises(TraceError) as ei:
        parse_nodes(text)
    assert (ei.value.line, ei.value.column) == (line, column)


def test_to_snapshot_nodes() -> None:
    (node,) = to_snapshot_nodes([OpenbNode("n0", 64000, 262144, 2, "V100M32")])
    assert node.name == "n0" and node.cpu_milli == 64000 and node.memory_mib == 262144
    assert [g.index for g in node.gpus] == [0, 1]
    assert all(g.mode is GpuMode.FRACTIONAL and g.model == "V100M32" for g in node.gpus)
    assert node.gpus[0].memory_mib == 32 * 1024


@pytest.mark.parametrize(
    ("pod", "kind", "count", "milli"),
    [
        (OpenbPod("a", 1, 1, 1, 1000, frozenset()), RequestKind.WHOLE, 1, 0),
        (OpenbPod("b", 1, 1, 8, 1000, frozenset({"G2"})), RequestKind.WHOLE, 8, 0),
        (OpenbPod("c", 1, 1, 1, 470, frozenset()), RequestKind.SHARED, 0, 470),
        (OpenbPod("d", 1, 1, 0, 0, frozenset()), RequestKind.NONE, 0, 0),
    ],
)
def test_to_pod_request(pod: OpenbPod, kind: RequestKind, count: int, milli: int) -> None:
    r = to_pod_request(pod)
    assert r.key == f"openb/{pod.name}"
    assert (r.kind, r.gpu_count, r.gpu_milli) == (kind, count, milli)
    assert r.gpu_models == (pod.gpu_spec if kind is not RequestKind.NONE else frozenset())
    assert r.gpu_demand_milli == pod.num_gpu * pod.gpu_milli
