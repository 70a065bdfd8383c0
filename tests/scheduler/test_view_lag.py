"""The grace of "gpupack's view is behind" answers (scheduler/extender/view_lag.py), alone and in
the filter and the group verbs: an error while it lasts, the old refusal after."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter
from sched_builders import FakeClock, filter_args, make_cache, mig_pod, node
from test_groups_builders import lws_pod, rig

from scheduler.extender.verbs import UNKNOWN_NODE, filter_nodes
from scheduler.extender.view_lag import ViewLag
from scheduler.extender.wire import ExtenderArgs
from scheduler.groups.plugin import GroupVerbs
from scheduler.memo.decide import Memo, capacity_behind


def lag(clock: FakeClock, grace_s: float = 30.0, limit: int = 100) -> tuple[ViewLag, Any]:
    registry = CollectorRegistry()
    counter = Counter("behind", "test", ["what"], registry=registry)
    return ViewLag(clock, grace_s, limit, counter), registry


def test_a_key_is_behind_for_its_grace_then_never_again() -> None:
    clock = FakeClock()
    v, registry = lag(clock)
    assert v.behind("node/a/1", "node")
    clock.advance(29.9)
    assert v.behind("node/a/1", "node")
    clock.advance(0.2)
    assert not v.behind("node/a/1", "node")
    assert not v.behind("node/a/1", "node")
    assert v.behind("node/a/2", "node")  # another version of the view: a grace of its own
    assert registry.get_sample_value("behind_total", {"what": "node"}) == 3


def test_keys_past_the_limit_forget_the_oldest_first() -> None:
    clock = FakeClock()
    v, _ = lag(clock, grace_s=10, limit=4)
    for i in range(4):
        v.behind(f"k{i}", "pod")
        clock.advance(1)
    clock.advance(30)  # all four past twice the grace: forgotten when a fifth comes
    assert v.behind("k4", "pod")
    assert v.behind("k0", "pod")  # forgotten, so a new grace
    v2, _ = lag(FakeClock(), grace_s=10, limit=4)
    for i in range(5):
        v2.behind(f"k{i}", "pod")  # none old: the older half goes
    assert len(v2._first) <= 4


CAPACITY_CASES = [
    # (pod, node, behind): the view has fewer devices of the pod's kind than it asks.
    (mig_pod("asr"), node("w", gpus=2, reconfigurable=False), True),
    (mig_pod("asr"), node("m", gpus=1, mig={"1g.10gb": 7}), False),
    (mig_pod("tts", "2g.20gb"), node("m", gpus=1, mig={"1g.10gb": 7}), True),
    (lws_pod("x", 0, 1, 3), node("w", gpus=2, reconfigurable=False), True),
    (lws_pod("x", 0, 1, 2), node("w", gpus=2, reconfigurable=False), False),
]


def test_capacity_behind() -> None:
    from kube.objects import pod_request

    for pod, n, behind in CAPACITY_CASES:
        cache = make_cache([n])
        name = n["metadata"]["name"]
        assert capacity_behind(cache.state, name, pod_request(pod)) is behind, (pod, name)


def test_the_filter_answers_an_error_for_the_grace_then_refuses() -> None:
    clock = FakeClock()
    v, _ = lag(clock)
    cache = make_cache([node("w", gpus=2, reconfigurable=False)])
    args = ExtenderArgs.decode(filter_args(mig_pod("asr"), ["w", "ghost"]))
    assert "try again" in filter_nodes(args, cache, Memo(), lag=v).error
    clock.advance(31)
    after = filter_nodes(args, cache, Memo(), lag=v)
    assert after.error == "" and after.failed["ghost"] == UNKNOWN_NODE
    assert "w" in after.unresolvable


def test_an_unseen_member_is_an_error_for_the_grace_then_refused() -> None:
    clock = FakeClock()
    v, _ = lag(clock)
    r = rig([node("n1", reconfigurable=False), node("n2", reconfigurable=False)],
            [lws_pod("a", 0, 2, 8)])
    worker = ExtenderArgs.decode(filter_args(lws_pod("a", 1, 2, 8), ["n1", "n2"]))
    got = GroupVerbs(r.book, v).filter(worker)
    assert got is not None and "not shown" in got.error
    clock.advance(31)
    got = GroupVerbs(r.book, v).filter(worker)
    assert got is not None and got.error == "" and not got.node_names
    assert all("already has all 2 members" in why for why in got.failed.values())
