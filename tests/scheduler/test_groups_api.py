"""Group reservations through the real ``kubernetes`` client against the FAKE API server
(tests/kube/fake_apiserver.py): the leader's annotation is written by a JSON merge patch,
and a restarted extender rebuilds the reservation from the listed pods."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_builders import FakeClock, node
from test_groups_builders import lws_pod

sys.path.insert(0, str(Path(__file__).parent.parent / "kube"))
from fake_apiserver import FakeApiServer

from kube.annotations import placement_annotations
from kube.reservations import (
    RESERVATION,
    ApiAnnotationPatcher,
    ReservationTap,
    ReservationWriter,
    decode,
)
from kube.source import ApiBinder, ApiSource
from scheduler.cache import ClusterCache
from scheduler.groups import ReservationBook

A = "llm/a/0"


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    server = FakeApiServer().start()
    for n in ("n1", "n2"):
        server.put("nodes", node(n, reconfigurable=False))
    server.put("pods", lws_pod("a", 0, 2, 8))
    try:
        yield server
    finally:
        server.stop()


def api(fake: FakeApiServer) -> Any:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = fake.url
    return client.ApiClient(cfg)


def extender(fake: FakeApiServer, clock: FakeClock) -> tuple[ClusterCache, ReservationBook,
                                                              ReservationWriter, ApiSource]:
    client = api(fake)
    cache = ClusterCache("gpupack")
    writer = ReservationWriter(ApiAnnotationPatcher(client), retries=0)
    book = ReservationBook(cache, ttl=300, clock=clock, writer=writer, retry_s=0)
    source = ApiSource(client, watch_timeout_s=2, backoff_initial_s=0.01, backoff_max_s=0.05)
    source.start(ReservationTap(cache, book))
    wait_for(lambda: cache.synced)
    return cache, book, writer, source


def test_reservation_written_by_merge_patch_and_rebuilt_after_restart(
    fake: FakeApiServer,
) -> None:
    clock = FakeClock()
    cache, book, writer, source = extender(fake, clock)
    try:
        with cache.view():
            pass
        res = book.reservations[A]
        assert writer.drain() == 1
        ctype, patch = fake.patches[-1]
        assert ctype.startswith("application/merge-patch+json")
        assert decode(patch["metadata"]["annotations"][RESERVATION]).group == A
        # Bind the leader through the real binder, as the app does.
        leader_node = res.slots[0].node
        with cache.view():
            req = cache.pending_pod("llm/a-0")
            assert req is not None
            placement = book.bind_member(req, req.uid, leader_node)
            assert placement is not None and not isinstance(placement, str)
            ann = {**placement_annotations(placement, "gpupack"), **book.bind_annotations(req)}
        ApiBinder(api(fake)).bind("llm", "a-0", req.uid, leader_node, ann)
        wait_for(lambda: (e := cache.pod_entry("llm/a-0")) is not None and e.node is not None)
    finally:
        source.stop()
    worker_room = res.slots[1]
    # Restart: a fresh cache and book from what the API lists.
    fake.put("pods", lws_pod("a", 1, 2, 8))
    cache2, book2, _, source2 = extender(fake, clock)
    try:
        wait_for(lambda: cache2.pending_pod("llm/a-0-1") is not None)
        with cache2.view():
            pass
        got = book2.reservations[A]
        assert got.slots[1].node == worker_room.node
        assert got.slots[1].gpus == worker_room.gpus
        owners = [g.whole_owner for n in cache2.state.nodes.values() for g in n.gpus]
        assert len([o for o in owners if o]) == 16  # leader's 8 + the worker's held 8, once
    finally:
        source2.stop()
