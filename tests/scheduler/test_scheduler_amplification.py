"""Filter and prioritize answers stay proportional to the nodes the extender knows: a
request naming 260,000 unknown (or repeated) nodes is not answered with tens of MB."""

from __future__ import annotations

import orjson
import pytest
from sched_builders import filter_args, make_cache, node, whole_pod

from packing.model import Snapshot
from packing.policies.gpupack import make_gpupack_scorer
from scheduler.extender.verbs import UNKNOWN_LISTED, UNKNOWN_NODE, NoPlan, filter_nodes, prioritize
from scheduler.extender.wire import ExtenderArgs, encode_priorities
from scheduler.memo.decide import Memo, ScorerRef

KNOWN = [f"gpu-{i}" for i in range(20)]


@pytest.fixture(scope="module")
def cache() -> object:
    return make_cache([node(n, gpus=8, reconfigurable=False) for n in KNOWN], [])


def request(names: list[str]) -> ExtenderArgs:
    return ExtenderArgs.decode(filter_args(whole_pod("llm", 1), names))


@pytest.mark.parametrize("junk", [
    [f"ghost-{i:06d}" for i in range(260_000)],  # unknown names
    KNOWN * 13_000,  # the known names, repeated
])
def test_answers_are_bounded_by_the_known_nodes(cache: object, junk: list[str]) -> None:
    args = request(KNOWN + junk)
    body = orjson.dumps(args.pod) + orjson.dumps(args.candidate_names)
    result = filter_nodes(args, cache, Memo())  # type: ignore[arg-type]
    answer = orjson.dumps(result.encode())
    assert len(answer) < 20_000 < len(body) // 100
    assert result.node_names is not None and set(result.node_names) == set(KNOWN)
    assert len(result.node_names) == len(KNOWN)  # each once
    assert len(result.failed) <= UNKNOWN_LISTED
    ranked = prioritize(args, cache, Memo(),  # type: ignore[arg-type]
                        ScorerRef(make_gpupack_scorer(Snapshot(nodes=())), 1), NoPlan())
    assert sorted(h.host for h in ranked) == sorted(KNOWN)
    assert len(orjson.dumps(encode_priorities(ranked))) < 20_000


def test_a_few_unknown_names_are_still_each_reported(cache: object) -> None:
    args = request(["gpu-0", "new-1", "new-2"])
    result = filter_nodes(args, cache, Memo())  # type: ignore[arg-type]
    assert result.failed == {"new-1": UNKNOWN_NODE, "new-2": UNKNOWN_NODE}


def test_node_objects_named_twice_are_echoed_once(cache: object) -> None:
    objs = [{"metadata": {"name": n}} for n in ["gpu-0", "gpu-0", "gpu-1"]]
    args = ExtenderArgs.decode({"Pod": whole_pod("llm", 1), "Nodes": {"items": objs}})
    result = filter_nodes(args, cache, Memo())  # type: ignore[arg-type]
    assert result.nodes is not None
    assert [n["metadata"]["name"] for n in result.nodes] == ["gpu-0", "gpu-1"]
