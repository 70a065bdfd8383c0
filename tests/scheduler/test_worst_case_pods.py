"""A bound pod whose gpupack inputs cannot be read is counted at its worst, never
skipped, and named by a metric and an Event (issue 35 item 3; kube/worst_case.py).

A pod's author can rewrite its annotations after it is bound. A bound share whose
``gpupack.io/gpu-memory`` no longer parsed was skipped at the next list: after a restart
its GPU looked free and shares were over-committed.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_builders import mig_pod, node, pod, shared_pod, whole_pod

from kube.cache import ClusterCache
from kube.cache_metrics import CacheCollector
from kube.evictions import PodRef
from kube.worst_case import EVENT_REASON, LARGEST_GPU_MIB, UnreadableEvents, worst_case_request
from packing.model import GPU_MILLI, PodRequest, RequestKind

L40S = "NVIDIA-L40S"


def l40s(name: str = "l40s", gpus: int = 1) -> dict[str, Any]:
    """A time-sliced L40S node (4 replicas per GPU)."""
    return node(name, L40S, gpus=gpus, shared_replicas=4, reconfigurable=False)


def cache_of(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> ClusterCache:
    cache = ClusterCache("gpupack")
    cache.replace(nodes, pods)
    cache.mark_synced()
    return cache


def broken(p: dict[str, Any], **ann: str) -> dict[str, Any]:
    p["metadata"].setdefault("annotations", {}).update(ann)
    return p


def room_for(cache: ClusterCache, req: PodRequest, node_name: str) -> bool:
    return bool(cache.state.options(req, node_name, gpus_only=True))


SMALL_SHARE = PodRequest("x/new", kind=RequestKind.SHARED, gpu_memory_mib=8192, gpu_milli=100)


def test_issue_case_a_share_rewritten_after_binding_keeps_its_gpu_after_a_restart() -> None:
    bound = broken(shared_pod("asr", "8Gi", "0.1", node="l40s", namespace="speech"),
                   **{"gpupack.io/gpu-memory": "lots"})
    cache = cache_of([l40s()], [bound])  # a fresh cache: the extender restarted
    entry = cache.pod_entry("speech/asr")
    assert entry is not None and entry.unreadable is not None
    assert "gpupack.io/gpu-memory: 'lots'" in entry.unreadable
    counted = cache.counted("speech/asr")
    assert counted is not None and counted[1].gpus == (0,)
    # The GPU it holds takes no other share (it may use all of its memory).
    assert not room_for(cache, SMALL_SHARE, "l40s")
    assert cache.bad_objects == 0
    # Fixed: counted as declared again, and the GPU has room beside it.
    cache.upsert_pod(shared_pod("asr", "8Gi", "0.1", node="l40s", namespace="speech"))
    assert cache.worst_case_pods() == {} and room_for(cache, SMALL_SHARE, "l40s")


@pytest.mark.parametrize(("p", "kind", "check", "named"), [
    (broken(whole_pod("w", 2, node="h100"), **{"gpupack.io/gpu-memory": "x"}),
     RequestKind.WHOLE, lambda r: r.gpu_count == 2, True),
    (broken(mig_pod("m", "3g.40gb", node="h100"), **{"gpupack.io/gpu-memory": "4 GB"}),
     RequestKind.MIG, lambda r: r.mig_profile == "3g.40gb", True),
    # The L40S's whole memory (its catalog size here: no GFD memory label) and compute.
    (broken(shared_pod("s", node="l40s"), **{"gpupack.io/gpu-compute": "most"}),
     RequestKind.SHARED, lambda r: r.gpu_memory_mib == 49152 and r.gpu_milli == GPU_MILLI,
     True),
    # An unusable group annotation of a bound pod was always read as no group.
    (broken(whole_pod("g", 1, node="h100"), **{"gpupack.io/group": "g",
                                                "gpupack.io/group-size": "-3"}),
     RequestKind.WHOLE, lambda r: r.group is None, False),
    # A MIG resource no GPU has: its CPU and memory only, still named.
    (pod("u", {"nvidia.com/mig-9g.900gb": "1"}, node="h100",
         annotations={"gpupack.io/gpu-memory": "x"}),
     RequestKind.NONE, lambda r: r.cpu_milli == 1000, True),
])
def test_each_kind_is_counted_at_its_worst(p: dict[str, Any], kind: RequestKind,
                                           check: Any, named: bool) -> None:
    cache = cache_of([node("h100", mig={"3g.40gb": 2}, whole=2, reconfigurable=False),
                      l40s()], [p])
    key = f"default/{p['metadata']['name']}"
    counted = cache.counted(key)
    assert counted is not None, "a bound pod was skipped"
    assert counted[0].kind is kind and check(counted[0]), counted[0]
    assert (key in cache.worst_case_pods()) is named


def test_an_unbound_unreadable_pod_is_still_refused() -> None:
    """gpupack cannot place a pod it cannot read: pending, it stays out (and counted as
    a bad object), as before."""
    cache = cache_of([l40s()], [broken(shared_pod("p"), **{"gpupack.io/gpu-memory": "x"})])
    assert cache.pod_entry("default/p") is None and cache.bad_objects == 1
    assert cache.worst_case_pods() == {}


def test_without_a_known_node_the_share_takes_the_largest_catalog_gpu() -> None:
    p = broken(shared_pod("s", node="elsewhere"), **{"gpupack.io/gpu-memory": "x"})
    req = worst_case_request(p)
    assert req is not None and req.gpu_memory_mib == LARGEST_GPU_MIB
    assert worst_case_request({"metadata": {}}) is None  # not even a name


def test_the_metric_names_each_pod() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    cache = cache_of([l40s(gpus=2)], [
        broken(shared_pod(f"s{i}", node="l40s", namespace="tts"),
               **{"gpupack.io/gpu-memory": "??"}) for i in range(2)])
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    text = generate_latest(registry).decode()
    assert "gpupack_pods_counted_worst_case 2.0" in text
    assert 'gpupack_pod_counted_worst_case{namespace="tts",pod="s1"} 1.0' in text
    cache.delete_pod("tts/s1")
    text = generate_latest(registry).decode()
    assert "gpupack_pods_counted_worst_case 1.0" in text and 'pod="s1"' not in text


class Events:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    def emit(self, pod: Any, reason: str, message: str, warning: bool = False) -> None:
        assert warning
        self.posted.append((pod.key, reason, message))


def test_one_event_per_pod_and_reason_on_the_leader_only() -> None:
    p = broken(shared_pod("s", node="l40s", namespace="tts"), **{"gpupack.io/gpu-memory": "x"})
    cache = cache_of([l40s()], [p])
    events, leads = Events(), [False]
    notifier = UnreadableEvents(cache.worst_case_pods, events, PodRef, lambda: leads[0])
    assert notifier.step() == 0  # a standby posts nothing
    leads[0] = True
    assert notifier.step() == 1 and notifier.step() == 0
    (key, reason, message), = events.posted
    assert key == "tts/s" and reason == EVENT_REASON
    assert "gpu-memory: 'x'" in message and "the whole GPU its share is on" in message
    # Another wrong value is named again; fixed, then broken again too.
    cache.upsert_pod(broken(shared_pod("s", node="l40s", namespace="tts"),
                            **{"gpupack.io/gpu-memory": "y"}))
    assert notifier.step() == 1
    cache.upsert_pod(shared_pod("s", node="l40s", namespace="tts"))
    assert notifier.step() == 0 and notifier.posted == {}
    cache.upsert_pod(p)
    assert notifier.step() == 1 and len(events.posted) == 3


VALUES = st.one_of(st.sampled_from(["1Gi", "8Gi", "40Gi"]),
                   st.sampled_from(["lots", "-1Gi", "8 Gi", "", "1e999Gi", "NaN"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), VALUES), min_size=1, max_size=12),
       st.booleans())
def test_a_bound_pod_is_always_counted_whatever_its_annotations_become(
        updates: list[tuple[int, str]], restart: bool) -> None:
    """Any sequence of rewrites of three bound shares' gpu-memory (valid or not), read
    by the watch or, after a restart, by a fresh list: every pod stays counted on its
    GPU, exactly the unreadable ones are named, and an unreadable share leaves no room
    for another share on its GPU."""
    cache = cache_of([l40s(gpus=3)], [])
    last: dict[int, str] = {}
    for i, value in updates:
        p = shared_pod(f"s{i}", "1Gi", "0.1", node="l40s", namespace="tts")
        p["metadata"]["annotations"]["gpupack.io/gpu-memory"] = value
        cache.upsert_pod(p)
        last[i] = value
    if restart:
        pods = []
        for i, value in last.items():
            p = shared_pod(f"s{i}", "1Gi", "0.1", node="l40s", namespace="tts")
            p["metadata"]["annotations"]["gpupack.io/gpu-memory"] = value
            pods.append(p)
        cache = cache_of([l40s(gpus=3)], pods)
    named = set(cache.worst_case_pods())
    for i, value in last.items():
        key = f"tts/s{i}"
        counted = cache.counted(key)
        assert counted is not None and counted[1].gpus, (key, value)
        unreadable = cache.pod_entry(key).unreadable is not None  # type: ignore[union-attr]
        assert (key in named) is unreadable
        if unreadable:
            g = cache.state.gpu("l40s", counted[1].gpus[0])
            assert g.info.memory_mib - g.shared_memory_used <= 0
