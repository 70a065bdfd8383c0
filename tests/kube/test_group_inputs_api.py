"""ResourceQuotas (list + watch through kube.api_source.ApiSource) and LeaderWorkerSets (a
periodic list through kube.groups.lws.LwsPoller) from a FAKE API server, through the real
``kubernetes`` client: the first lists gate readiness, a quota change reaches the
inputs, and an absent CRD (404 on the list) means "not installed", not an error loop."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))

from kube.api_source import ApiSource
from kube.cache import ClusterCache
from kube.groups.inputs import GroupInputs
from kube.groups.lws import LwsPoller


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def quota(hard: str, name: str = "gpus") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"namespace": "llm", "name": name},
            "spec": {"hard": {"requests.nvidia.com/gpu": hard}}}


def lws(size: int) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"namespace": "llm", "name": "vllm"},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": size}}}


def test_quotas_are_listed_before_sync_and_watched_after(fake: FakeApiServer, api: Any) -> None:
    fake.put("resourcequotas", quota("8"))
    cache = ClusterCache("gpupack")
    inputs = GroupInputs(lws_listed=True)
    source = ApiSource(api, watch_timeout_s=2, backoff_initial_s=0.01, watch_quotas=True)
    source.start(cache, None, inputs)
    try:
        wait_for(lambda: cache.synced)
        assert inputs.listed() and inputs.quotas("llm")[0].hard == {"nvidia.com/gpu": 8}
        fake.put("resourcequotas", quota("4"))
        wait_for(lambda: inputs.quotas("llm")[0].hard == {"nvidia.com/gpu": 4})
        fake.delete("resourcequotas", "llm/gpus")
        wait_for(lambda: inputs.quotas("llm") == ())
        assert "resourcequotas" in fake.list_requests
        assert any(k == "resourcequotas" for k, _ in fake.watch_requests)
    finally:
        source.stop()


def test_a_source_that_watches_quotas_needs_their_sink(api: Any) -> None:
    with pytest.raises(ValueError, match="quota sink"):
        ApiSource(api, watch_quotas=True).start(ClusterCache("gpupack"))


def test_absent_crd_is_not_installed_and_polled_at_the_interval_only(fake: FakeApiServer,
                                                                     api: Any) -> None:
    inputs = GroupInputs(quotas_listed=True)
    poller = LwsPoller(api, inputs, interval_s=0.3, min_gap_s=0.1)
    inputs.on_unknown_lws = poller.nudge
    poller.start()
    try:
        wait_for(inputs.listed)
        assert poller.installed is False and not inputs.lws_installed
        # Asking for an LWS while the CRD is absent asks the API for nothing more.
        for _ in range(20):
            assert inputs.lws("llm", "vllm") is None
        time.sleep(1.0)
        assert 2 <= poller.lists <= 6, poller.lists  # ~ every 0.3 s: no error loop
        assert poller.errors == 0
        # The CRD installed later: the next list finds the objects.
        fake.put("leaderworkersets", lws(4))
        fake.lws_installed = True
        wait_for(lambda: inputs.lws("llm", "vllm") is not None)
        found = inputs.lws("llm", "vllm")
        assert found is not None and found.size == 4 and poller.installed is True
    finally:
        poller.stop()


def test_an_unknown_lws_asks_for_a_list_sooner(fake: FakeApiServer, api: Any) -> None:
    fake.lws_installed = True
    inputs = GroupInputs(quotas_listed=True)
    poller = LwsPoller(api, inputs, interval_s=60, min_gap_s=0.05)
    inputs.on_unknown_lws = poller.nudge
    poller.start()
    try:
        wait_for(inputs.listed)
        assert inputs.lws("llm", "vllm") is None  # not created yet: nudges the poller
        fake.put("leaderworkersets", lws(2))
        inputs.lws("llm", "vllm")
        wait_for(lambda: inputs.lws("llm", "vllm") is not None, timeout=5)
    finally:
        poller.stop()
