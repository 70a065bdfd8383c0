"""The age limit on node agent inventories (kube.inventory_age, ClusterCache): an
inventory older than the limit is read as absent, at once when it arrives old and by
expire_inventories when it ages in place; a fresh one is trusted again."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from test_kube_objects import k8s_node, k8s_pod

from kube.cache import ClusterCache
from kube.inventory_age import InventoryAge, essentials, without_inventory, written_at
from kube.objects import NO_OBSERVATION

T = 1_700_000_000
LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1",
          "nvidia.com/gpu.replicas": "4"}
ALLOC = {"nvidia.com/gpu.shared": "4"}


def inventory(node: str, ts: int, peak: int = 20_000) -> str:
    return json.dumps({"v": 1, "node": node, "ts": ts, "gpus": [
        {"i": 0, "uuid": "GPU-1", "model": "NVIDIA-H100-80GB-HBM3", "mem": 81559, "used": 0,
         "mode": "shared", "pods": [{"pod": "ml/s", "used": 0, "peak": peak}]}]})


def node(name: str, ts: int | None) -> dict[str, Any]:
    n = k8s_node(name, LABELS, ALLOC)
    if ts is not None:
        n["metadata"]["annotations"] = {"gpupack.io/inventory": inventory(name, ts)}
    return n


def shared_pod(on: str) -> dict[str, Any]:
    return k8s_pod("s", {"nvidia.com/gpu.shared": 1}, {"gpupack.io/gpu-memory": "8Gi"},
                   node=on)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cache_at(clock: Clock, max_age: float = 900.0) -> ClusterCache:
    return ClusterCache("gpupack", inventory_age=InventoryAge(max_age), clock=clock)


def trusted(cache: ClusterCache, name: str) -> bool:
    """Whether the node's GPUs and peaks come from its inventory."""
    with cache.lock:
        gpus = cache.state.nodes[name].info.gpus
        return not gpus[0].inferred and cache.observation(name) != NO_OBSERVATION


# --- the pure part -------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ts"), [
    (None, None),
    ("not json", None),
    ('{"ts": "1700000000"}', None),
    ('{"ts": true}', None),
    ("[1, 2]", None),
    ('{"v": 1, "ts": 1700000000}', 1_700_000_000),
])
def test_written_at(text: str | None, ts: int | None) -> None:
    assert written_at(text) == ts


@pytest.mark.parametrize(("now", "stale"), [
    (T - 3600, False),  # written "in the future": the node's clock runs ahead
    (T, False),
    (T + 899, False),
    (T + 900, True),
    (T + 86_400, True),
])
def test_stale_after_the_limit(now: float, stale: bool) -> None:
    why = InventoryAge(900).stale(inventory("a", T), now)
    assert (why is not None) == stale
    if why is not None:
        assert f"written at ts {T}" in why and "900 s limit" in why, why
        assert "gpupack.io/inventory" in why


def test_no_timestamp_is_never_stale_here() -> None:
    # node_info refuses an unreadable inventory on its own; age has nothing to add.
    assert InventoryAge(900).stale("garbage", T * 2) is None
    assert InventoryAge(900).expires(None) is None


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_the_limit_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        InventoryAge(bad)


def test_copies_leave_the_node_alone() -> None:
    n = node("a", T)
    n["metadata"]["annotations"]["other"] = "x"
    n["status"]["conditions"] = [{"type": "Ready"}]
    n["spec"] = {"unschedulable": True}
    bare = without_inventory(n)
    assert bare["metadata"]["annotations"] == {"other": "x"}
    assert "gpupack.io/inventory" in n["metadata"]["annotations"]
    kept = essentials(n)
    assert kept == {"metadata": {"name": "a", "labels": LABELS,
                                 "annotations": n["metadata"]["annotations"]},
                    "spec": {"unschedulable": True},
                    "status": {"allocatable": n["status"]["allocatable"]}}


# --- the cache -------------------------------------------------------------------------------


def test_an_inventory_ageing_in_place_is_dropped_by_expire() -> None:
    clock = Clock(T + 100)
    cache = cache_at(clock)
    cache.replace([node("a", T)], [shared_pod("a")])
    assert trusted(cache, "a")
    assert cache.expire_inventories() == []
    clock.now = T + 899
    assert cache.expire_inventories() == []
    assert trusted(cache, "a")
    clock.now = T + 900
    assert cache.expire_inventories() == ["a"]
    assert not trusted(cache, "a")
    assert cache.stale_inventories == 1
    # The pod is sized by its request again, not by the peak of a stopped agent.
    ((req, _),) = cache.pods_on("a")
    assert req.gpu_memory_mib == 8192
    assert cache.expire_inventories() == []  # once


def test_a_fresh_inventory_is_trusted_again() -> None:
    clock = Clock(T + 2000)
    cache = cache_at(clock)
    cache.replace([node("a", T)], [])
    assert not trusted(cache, "a") and cache.stale_inventories == 1
    cache.upsert_node(node("a", T + 1990))
    assert trusted(cache, "a") and cache.stale_inventories == 0
    clock.now = T + 1990 + 900
    assert cache.expire_inventories() == ["a"]


def test_an_inventory_arriving_stale_is_ignored_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    cache = cache_at(Clock(T + 5000))
    with caplog.at_level(logging.WARNING, logger="gpupack.kube.cache"):
        cache.replace([node("a", T)], [])
        cache.upsert_node(node("a", T + 1))  # a later write, still stale
    assert not trusted(cache, "a")
    lines = [r.getMessage() for r in caplog.records if "older than the 900 s limit" in r.message]
    assert len(lines) == 1 and lines[0].startswith("node a: "), lines


def test_an_inventory_crossing_the_limit_during_the_read_is_not_applied_fresh() -> None:
    # The first look (outside the lock) finds it fresh; the second (under the lock,
    # where expire_inventories runs) finds it stale: the stale reading wins.
    times = iter([T + 899.0, T + 900.0])
    cache = ClusterCache("gpupack", inventory_age=InventoryAge(900),
                         clock=lambda: next(times, T + 900.0))
    cache.upsert_node(node("a", T))
    assert not trusted(cache, "a")
    assert cache.stale_inventories == 1


def test_a_deleted_node_leaves_nothing_to_expire() -> None:
    clock = Clock(T)
    cache = cache_at(clock)
    cache.replace([node("a", T), node("b", T - 1000)], [])
    assert cache.stale_inventories == 1
    cache.delete_node("a")
    cache.delete_node("b")
    clock.now = T + 10_000
    assert cache.expire_inventories() == [] and cache.stale_inventories == 0


def test_without_a_limit_nothing_ages() -> None:
    cache = ClusterCache("gpupack", clock=lambda: T + 10**9)
    cache.replace([node("a", T)], [])
    assert trusted(cache, "a")
    assert cache.expire_inventories() == [] and cache.stale_inventories == 0


class AgeMachine(RuleBasedStateMachine):
    """Writes of inventories of any age, clock steps and expiries in any order: after an
    expiry, a node's inventory is trusted exactly when the last one written for it is
    younger than the limit."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(T)
        self.cache = cache_at(self.clock, max_age=100.0)
        self.written: dict[str, int | None] = {}

    @rule(name=st.sampled_from(["a", "b", "c"]), age=st.one_of(st.none(), st.integers(-50, 250)))
    def write(self, name: str, age: int | None) -> None:
        ts = None if age is None else int(self.clock.now) - age
        assert self.cache.upsert_node(node(name, ts))
        self.written[name] = ts

    @rule(name=st.sampled_from(["a", "b", "c"]))
    def delete(self, name: str) -> None:
        self.cache.delete_node(name)
        self.written.pop(name, None)

    @rule(step=st.integers(0, 120))
    def tick(self, step: int) -> None:
        self.clock.now += step

    @rule()
    def expire(self) -> None:
        self.cache.expire_inventories()
        for name, ts in self.written.items():
            fresh = ts is not None and self.clock.now < ts + 100
            assert trusted(self.cache, name) == fresh, (name, ts, self.clock.now)

    @invariant()
    def stale_count_is_the_nodes_written_stale(self) -> None:
        # Counted as stale: nodes whose inventory was already too old when last read.
        assert self.cache.stale_inventories <= len(self.written)


TestAgeMachine = AgeMachine.TestCase
TestAgeMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
