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
from hypothesis.stateful import RuleBasedStateMachine, rule
from test_kube_objects import k8s_node, k8s_pod

from kube.cache import ClusterCache
from kube.inventory_age import (
    InventoryAge,
    essentials,
    steady_clock,
    without_inventory,
    written_at,
)
from kube.node_objects import NO_OBSERVATION

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
    ("[" * 200_000, None),  # nested deeper than Python's recursion limit
    ('{"ts": 1' + "0" * 400 + "}", None),  # an integer no float holds
    ('{"ts": -5}', None),
])
def test_written_at(text: str | None, ts: int | None) -> None:
    assert written_at(text) == ts


@pytest.mark.parametrize("text", ["[" * 200_000, '{"v": 1, "ts": 1' + "0" * 400 + "}"])
def test_an_unreadable_ts_does_not_stop_the_node_list(text: str) -> None:
    # One Node whose inventory the age check cannot read must not fail the list (the
    # cache would relist for ever and never sync): it is read without the limit and the
    # next node is read too.
    cache = cache_at(Clock(T))
    bad = node("bad", None)
    bad["metadata"]["annotations"] = {"gpupack.io/inventory": text}
    cache.replace([bad, node("good", T)], [])
    assert set(cache.state.nodes) >= {"good"} and trusted(cache, "good")


def test_the_default_clock_ignores_steps_of_the_system_clock() -> None:
    wall, mono = [T + 0.0], [100.0]
    clock = steady_clock(lambda: wall[0], lambda: mono[0])
    wall[0] -= 3600  # an NTP step back an hour
    mono[0] += 1000
    assert clock() == T + 1000
    wall[0] += 7200
    assert clock() == T + 1000


@pytest.mark.parametrize(("ts", "now", "known", "expires"), [
    (T, T + 100, None, T + 900),  # first sight: dated by its own ts
    (T + 3600, T, None, T + 900),  # first sight from the future: dated by now
    (T, T + 5000, (T, T + 900), T + 900),  # the same write seen again: unchanged
    (T - 700, T, (T - 1000, T - 100), T + 900),  # a new write counts from now ...
    (T + 3600, T, (T + 3300, T - 100), T + 900),  # ... whatever the node's clock says
    (T - 50, T, (T, T + 900), T + 850),  # an older write than the last: its own ts
])
def test_expiry_on_the_extenders_clock(ts: int, now: float, known: tuple[int, float] | None,
                                       expires: float) -> None:
    assert InventoryAge(900).expires(ts, now, known) == expires


@pytest.mark.parametrize(("now", "stale"), [(T + 899, False), (T + 900, True)])
def test_the_reason_names_the_annotation_and_the_limit(now: float, stale: bool) -> None:
    why = InventoryAge(900).reason(T - 50, T + 900, now)
    assert (why is not None) == stale
    if why is not None:
        assert "gpupack.io/inventory: written at ts 1699999950, not rewritten for 900 s" in why
        assert "900 s limit" in why


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf")])
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
    cache.upsert_node(node("a", T + 1990))  # a new write: its agent works
    assert trusted(cache, "a") and cache.stale_inventories == 0
    clock.now = T + 2000 + 899  # counted from when the extender saw it
    assert cache.expire_inventories() == []
    clock.now += 1
    assert cache.expire_inventories() == ["a"]


def test_an_inventory_arriving_stale_is_ignored_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    cache = cache_at(Clock(T + 5000))
    again = node("a", T)
    again["metadata"]["labels"]["team"] = "speech"  # the Node changed, the inventory not
    with caplog.at_level(logging.WARNING, logger="gpupack.kube.cache"):
        cache.replace([node("a", T)], [])
        cache.upsert_node(again)
    assert not trusted(cache, "a")
    lines = [r.getMessage() for r in caplog.records if "longer than the 900 s limit" in r.message]
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


def test_a_node_whose_clock_runs_behind_stays_trusted_between_writes() -> None:
    # The node's clock is 700 s behind the extender's. Seen first at start-up, its
    # inventory is dated by its own ts (it could be a dead agent's) ...
    clock = Clock(T)
    cache = cache_at(clock)
    cache.upsert_node(node("a", T - 700))
    clock.now = T + 200
    assert cache.expire_inventories() == ["a"]
    # ... until the agent's next write, which counts from when the extender sees it.
    clock.now = T + 300
    cache.upsert_node(node("a", T - 700 + 300))
    assert trusted(cache, "a")
    clock.now = T + 300 + 299  # the agent writes every 300 s: never stale now
    assert cache.expire_inventories() == [] and trusted(cache, "a")
    cache.upsert_node(node("a", T - 700 + 600))
    clock.now = T + 599 + 899
    assert cache.expire_inventories() == [] and trusted(cache, "a")


def test_a_dead_agent_on_a_node_whose_clock_runs_ahead_expires_on_time() -> None:
    clock = Clock(T)
    cache = cache_at(clock)
    cache.upsert_node(node("a", T + 3600))  # an hour ahead
    clock.now = T + 300
    cache.upsert_node(node("a", T + 3900))  # its last write: then the agent stops
    clock.now = T + 300 + 900
    assert cache.expire_inventories() == ["a"] and not trusted(cache, "a")


def test_a_clock_stepping_back_during_the_read_applies_the_inventory_fresh() -> None:
    # The first look (outside the lock) finds it stale; the clock steps back before the
    # second (an NTP step): the node is applied as the second look finds it.
    times = iter([T + 900.0, T + 899.0])
    cache = ClusterCache("gpupack", inventory_age=InventoryAge(900),
                         clock=lambda: next(times, T + 899.0))
    cache.upsert_node(node("a", T))
    assert trusted(cache, "a") and cache.stale_inventories == 0


def test_inventories_do_not_fill_the_node_shape_memo() -> None:
    # Every write of an inventory is a new text (its ts): a memo keyed by it would
    # only grow, and stop memoising anything at its cap.
    clock = Clock(T)
    cache = cache_at(clock)
    for k in range(50):
        clock.now = T + 300 * k
        cache.upsert_node(node("a", T + 300 * k))
        cache.upsert_node(node(f"plain-{k % 3}", None))
    assert len(cache._shapes) == 1  # the one shape of the nodes without an inventory


def test_a_node_that_fails_to_re_read_does_not_stop_the_others(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(T)
    cache = cache_at(clock)
    cache.replace([node("a", T), node("b", T)], [])
    upsert = cache.upsert_node

    def failing(obj: dict[str, Any]) -> bool:
        if obj["metadata"]["name"] == "a":
            raise RuntimeError("boom")
        return upsert(obj)

    monkeypatch.setattr(cache, "upsert_node", failing)
    clock.now = T + 900
    with caplog.at_level(logging.ERROR, logger="gpupack.kube.cache"):
        assert cache.expire_inventories() == ["b"]
    assert any("node a: reading it again" in r.getMessage() for r in caplog.records)
    assert not trusted(cache, "b")
    assert cache.expire_inventories() == []  # "a" is not retried every pass


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
    """Writes of inventories with any ts (the node's clock may be off), the same Node seen
    again, clock steps, deletions and expiries in any order. The model: a write newer
    than the last one seen is trusted for the limit from when it is seen; the first one
    seen (or an older one) from its own ts when that is earlier; the same one seen again
    keeps its time. After an expiry a node is trusted exactly while that time lasts."""

    LIMIT = 100.0

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock(T)
        self.cache = cache_at(self.clock, max_age=self.LIMIT)
        self.ts: dict[str, int | None] = {}  # the last inventory written on each node
        self.until: dict[str, float] = {}  # node -> trusted until (model)
        self.seen: dict[str, int] = {}  # node -> ts the model last saw

    def _see(self, name: str, ts: int | None) -> None:
        now = self.clock.now
        if ts is None:
            self.seen.pop(name, None)
            self.until.pop(name, None)
            return
        last = self.seen.get(name)
        if last is None or ts < last:
            self.until[name] = min(ts, now) + self.LIMIT
        elif ts > last:
            self.until[name] = now + self.LIMIT
        self.seen[name] = ts

    @rule(name=st.sampled_from(["a", "b", "c"]),
          age=st.one_of(st.none(), st.integers(-300, 250)))
    def write(self, name: str, age: int | None) -> None:
        ts = None if age is None else int(self.clock.now) - age
        assert self.cache.upsert_node(node(name, ts))
        self.ts[name] = ts
        self._see(name, ts)

    @rule(name=st.sampled_from(["a", "b", "c"]))
    def seen_again(self, name: str) -> None:
        if name in self.ts:
            assert self.cache.upsert_node(node(name, self.ts[name]))

    @rule(name=st.sampled_from(["a", "b", "c"]))
    def delete(self, name: str) -> None:
        self.cache.delete_node(name)
        self.ts.pop(name, None)
        self.seen.pop(name, None)
        self.until.pop(name, None)

    @rule(step=st.integers(0, 120))
    def tick(self, step: int) -> None:
        self.clock.now += step

    @rule()
    def expire(self) -> None:
        self.cache.expire_inventories()
        for name, ts in self.ts.items():
            fresh = ts is not None and self.clock.now < self.until[name]
            assert trusted(self.cache, name) == fresh, (name, ts, self.clock.now)
        assert self.cache.stale_inventories == sum(
            1 for name, ts in self.ts.items() if ts is not None
            and self.clock.now >= self.until[name])


TestAgeMachine = AgeMachine.TestCase
TestAgeMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
