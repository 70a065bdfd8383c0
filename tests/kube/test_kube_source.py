"""kube/source.py driven through the real ``kubernetes`` client against a FAKE API
server (tests/kube/fake_apiserver.py): list+watch, 410 Gone, dropped connections,
bookmarks, Binding answered with a Status, annotation patch."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import node, whole_pod

from kube.api_source import ApiBinder, ApiSource
from kube.cache import ClusterCache
from kube.source import BindError


def wait_for(cond: Callable[[], bool], timeout: float = 10.0,
             msg: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached in time {msg()}")
        time.sleep(0.02)


@pytest.fixture
def fake(fake: FakeApiServer) -> FakeApiServer:
    """conftest's fake API server, with a pending pod too (``api`` is a client of it)."""
    fake.put("pods", whole_pod("p0", 1, uid="uid-p0"))
    return fake


@pytest.fixture
def running(api: Any) -> Iterator[tuple[ClusterCache, ApiSource]]:
    cache = ClusterCache("gpupack")
    source = ApiSource(api, watch_timeout_s=2, backoff_initial_s=0.01, backoff_max_s=0.05)
    source.start(cache)
    try:
        wait_for(lambda: cache.synced)
        yield cache, source
    finally:
        source.stop()


def test_stop_ends_a_quiet_long_watch_at_once(api: Any) -> None:
    # A 300 s watch on a cluster where nothing happens: stop() must not wait for the API
    # server to end it (the reader is blocked in a socket read the whole time).
    cache = ClusterCache("gpupack")
    source = ApiSource(api, watch_timeout_s=300)
    source.start(cache)
    wait_for(lambda: cache.synced)
    time.sleep(0.2)  # both watches open and blocked
    t0 = time.monotonic()
    source.stop()
    assert source.join(5.0), "watch threads still running 5 s after stop()"
    assert time.monotonic() - t0 < 5.0


def test_list_then_watch_feeds_the_cache(fake: FakeApiServer,
                                         running: tuple[ClusterCache, ApiSource]) -> None:
    cache, _ = running
    assert cache.has_node("gpu-a")
    assert cache.pending_pod("default/p0") is not None
    fake.put("nodes", node("gpu-b", gpus=4))
    fake.put("pods", whole_pod("p1", 1, uid="uid-p1", node="gpu-a"))
    wait_for(lambda: cache.has_node("gpu-b") and cache.counted("default/p1") is not None)
    fake.delete("pods", "default/p1")
    fake.delete("nodes", "gpu-b")
    wait_for(lambda: not cache.has_node("gpu-b") and cache.pod_entry("default/p1") is None)


def test_a_list_comes_in_pages_and_a_relist_drops_what_is_gone(
        fake: FakeApiServer, api: Any) -> None:
    for i in range(7):
        fake.put("pods", whole_pod(f"q{i}", 1, uid=f"uid-q{i}"))
    cache = ClusterCache("gpupack")
    cache.upsert_pod(whole_pod("stale", 1, uid="uid-stale"))  # deleted while not watched
    source = ApiSource(api, watch_timeout_s=2, backoff_initial_s=0.01, list_page=3)
    source.start(cache)
    try:
        wait_for(lambda: cache.synced)
        # 8 pods (p0 and q0-q6) at 3 a page: 3 requests, every pod fed once.
        assert fake.list_requests.count("pods") == 3
        assert all(cache.pending_pod(f"default/q{i}") is not None for i in range(7))
        assert cache.pending_pod("default/p0") is not None
        assert cache.pod_entry("default/stale") is None
        assert cache.has_node("gpu-a") and cache.counts()["pods"] == 8
    finally:
        source.stop()


def test_410_gone_relists(fake: FakeApiServer, running: tuple[ClusterCache, ApiSource]) -> None:
    cache, source = running
    fake.compact()
    fake.drop_watches()  # the watch must resume from a now-compacted version
    fake.put("pods", whole_pod("after", 1, uid="uid-after"))
    wait_for(lambda: source.relists["pods"] >= 1 and source.relists["nodes"] >= 1)
    wait_for(lambda: cache.pending_pod("default/after") is not None)
    assert fake.list_requests.count("pods") >= 2


def test_dropped_connection_reconnects_from_the_last_version(
    fake: FakeApiServer, running: tuple[ClusterCache, ApiSource]
) -> None:
    cache, source = running
    fake.put("pods", whole_pod("before", 1, uid="uid-before"))
    wait_for(lambda: cache.pending_pod("default/before") is not None)
    lists = len(fake.list_requests)
    fake.drop_watches()
    wait_for(lambda: source.reconnects["pods"] >= 1)
    fake.put("pods", whole_pod("later", 1, uid="uid-later"))
    wait_for(lambda: cache.pending_pod("default/later") is not None)
    assert len(fake.list_requests) == lists  # resumed, not re-listed
    resumed = [rv for kind, rv in fake.watch_requests if kind == "pods"]
    assert int(resumed[-1]) >= int(resumed[0])


def test_bookmark_moves_the_resume_point(fake: FakeApiServer,
                                         running: tuple[ClusterCache, ApiSource]) -> None:
    _, source = running
    fake.put("nodes", node("gpu-c", gpus=1))  # a node event: pods watch sees nothing
    current = fake.rv
    fake.bookmark()
    time.sleep(0.2)
    fake.drop_watches()
    wait_for(lambda: source.reconnects["pods"] >= 1)
    wait_for(lambda: any(k == "pods" and rv == str(current) for k, rv in fake.watch_requests),
             msg=lambda: f"{current} {fake.watch_requests}")


def test_binder_reads_the_status_answer_and_needs_no_pod_patch(
    fake: FakeApiServer, api: Any
) -> None:
    binder = ApiBinder(api)
    binder.bind("default", "p0", "uid-p0", "gpu-a", {"gpupack.io/gpus": "1"})
    sent = fake.bindings[-1]
    assert sent["metadata"]["uid"] == "uid-p0"
    assert sent["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}
    assert sent["metadata"]["annotations"] == {"gpupack.io/gpus": "1"}
    pod = fake.objects["pods"]["default/p0"]
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert pod["metadata"]["annotations"]["gpupack.io/gpus"] == "1"  # from the Binding
    assert fake.patches == []  # the extender has no right to patch pods


@pytest.mark.parametrize(("name", "uid", "message"), [
    ("p0", "stale-uid", "Conflict: Operation cannot be fulfilled on pods/binding \"p0\": "
                        "Precondition failed"),
    ("ghost", "", 'NotFound: pods "ghost" not found'),
])
def test_binder_errors_carry_the_status_message(fake: FakeApiServer, api: Any, name: str,
                                                uid: str, message: str) -> None:
    with pytest.raises(BindError) as e:
        ApiBinder(api).bind("default", name, uid, "gpu-a", {})
    assert message in str(e.value)


def test_rebinding_a_bound_pod_is_refused(fake: FakeApiServer, api: Any) -> None:
    binder = ApiBinder(api)
    binder.bind("default", "p0", "uid-p0", "gpu-a", {})
    with pytest.raises(BindError, match="already assigned to node"):
        binder.bind("default", "p0", "uid-p0", "gpu-a", {})


def test_bind_through_the_watch_confirms_the_assumption(
    fake: FakeApiServer, api: Any, running: tuple[ClusterCache, ApiSource]
) -> None:
    from packing.model import Placement

    cache, _ = running
    req = cache.pending_pod("default/p0")
    cache.assume(req, req.uid, Placement(req.key, "gpu-a", (1,)))
    ApiBinder(api).bind("default", "p0", "uid-p0", "gpu-a", {"gpupack.io/gpus": "1"})
    wait_for(lambda: not cache.assumed_keys())
    assert cache.counted("default/p0")[1].gpus == (1,)


def test_a_binding_answered_too_late_is_an_unknown_outcome_not_a_refusal(
    fake: FakeApiServer, api: Any, running: tuple[ClusterCache, ApiSource]
) -> None:
    """The API server applies a Binding after the binder gave up (issue 35: bind's API
    timeout was longer than kube-scheduler's extender timeout, and a bind applied late
    was forgotten). BindUnknown says so; the assumption made for it is confirmed when
    the watch shows the pod bound."""
    from kube.source import BindUnknown
    from packing.model import Placement

    cache, _ = running
    req = cache.pending_pod("default/p0")
    cache.assume(req, req.uid, Placement(req.key, "gpu-a", (1,)))
    fake.bind_delay_s = 1.0
    started = time.monotonic()
    with pytest.raises(BindUnknown, match=r"no answer within 0\.3s"):
        ApiBinder(api, timeout_s=0.3).bind("default", "p0", "uid-p0", "gpu-a",
                                           {"gpupack.io/gpus": "1"})
    assert time.monotonic() - started < 0.9
    assert cache.is_assumed("default/p0")  # nobody forgot it
    wait_for(lambda: not cache.assumed_keys())  # applied late: the watch confirms it
    assert cache.counted("default/p0")[1].gpus == (1,)
