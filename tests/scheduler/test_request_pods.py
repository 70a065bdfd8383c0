"""scheduler/extender/request_pods.py: request-only pods are remembered until their bind, bounded
in count and in time."""

from __future__ import annotations

import pytest
from sched_builders import FakeClock, whole_pod

from kube.objects import pod_request
from scheduler.extender.request_pods import RequestPods


def remember(mem: RequestPods, name: str, uid: str | None = None) -> None:
    obj = whole_pod(name, 1, uid=uid)
    mem.remember(obj, pod_request(obj))


def test_taken_once_with_its_uid() -> None:
    mem = RequestPods(clock=FakeClock())
    remember(mem, "a", uid="u1")
    assert mem.take("default/a", "other-uid") is None
    got = mem.take("default/a", "u1")
    assert got is not None and got.req.key == "default/a" and got.obj["metadata"]["uid"] == "u1"
    assert mem.take("default/a", "u1") is None  # the bind took it
    mem.put_back(got)
    assert mem.take("default/a", "") is not None  # a failed bind may retry


def test_bounded_in_count_least_recently_seen_first_out() -> None:
    mem = RequestPods(limit=3, clock=FakeClock())
    for name in ("a", "b", "c"):
        remember(mem, name)
    remember(mem, "a")  # seen again: now the newest
    remember(mem, "d")
    assert len(mem) == 3
    assert mem.take("default/b", "") is None
    assert all(mem.take(f"default/{n}", "") is not None for n in ("a", "c", "d"))


def test_bounded_in_time() -> None:
    clock = FakeClock()
    mem = RequestPods(ttl_s=60, clock=clock)
    remember(mem, "a")
    clock.advance(30)
    remember(mem, "b")
    clock.advance(31)
    assert mem.take("default/a", "") is None
    assert mem.take("default/b", "") is not None


@pytest.mark.parametrize(("limit", "ttl"), [(0, 1.0), (1, 0.0), (-1, 5.0)])
def test_bounds_must_be_positive(limit: int, ttl: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        RequestPods(limit=limit, ttl_s=ttl)
