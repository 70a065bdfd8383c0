"""Group reservations through the real ``kubernetes`` client against the FAKE API server
(tests/kube/fake_apiserver.py): records are ConfigMaps in gpupack's namespace, written
only by the replica whose kube-scheduler holds the Lease; a restarted extender rebuilds
the reservation from the listed records before it answers."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sched_builders import FakeClock, node
from test_groups_builders import lws_pod

sys.path.insert(0, str(Path(__file__).parent.parent / "kube"))
from fake_apiserver import FakeApiServer

from kube.annotations import placement_annotations
from kube.leader import LeaseWatcher
from kube.reservations import (
    RECORD_SELECTOR,
    ApiRecordStore,
    RecordWriter,
    ReservationTap,
    record_name,
    record_of,
)
from kube.source import ApiBinder, ApiSource
from scheduler.cache import ClusterCache
from scheduler.groups import ReservationBook

A = "llm/a/0"
NS = "gpupack"


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


def lease(holder: str, renewed: float, duration: int = 15) -> dict[str, Any]:
    stamp = datetime.fromtimestamp(renewed, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "gpupack-scheduler", "namespace": NS},
            "spec": {"holderIdentity": f"{holder}_5f0c", "leaseDurationSeconds": duration,
                     "renewTime": stamp}}


def always() -> bool:
    return True


class Replica:
    """One extender process: cache, book, record writer, watch, lease."""

    def __init__(self, fake: FakeApiServer, clock: FakeClock, identity: str | None = None,
                 ) -> None:
        client = api(fake)
        self.cache = ClusterCache("gpupack")
        self.lease = None
        leader: Callable[[], bool] = always
        if identity is not None:
            self.lease = LeaseWatcher(client, NS, "gpupack-scheduler", identity,
                                      clock=time.time)
            self.lease.poll()
            leader = self.lease.is_leader
        self.writer = RecordWriter(ApiRecordStore(client, NS), is_leader=leader, retries=0)
        self.book = ReservationBook(self.cache, ttl=300, clock=clock, writer=self.writer,
                                    retry_s=0, is_leader=leader, namespace=NS)
        self.source = ApiSource(client, watch_timeout_s=2, backoff_initial_s=0.01,
                                backoff_max_s=0.05, records_namespace=NS,
                                records_selector=RECORD_SELECTOR)
        tap = ReservationTap(self.cache, self.book)
        self.source.start(tap, tap)
        wait_for(lambda: self.book.ready)

    def stop(self) -> None:
        self.source.stop()


def test_reservation_written_as_a_configmap_and_rebuilt_after_restart(
    fake: FakeApiServer,
) -> None:
    clock = FakeClock()
    r1 = Replica(fake, clock)
    try:
        res = r1.book.reservations[A]
        assert r1.writer.drain() == 1
        obj = fake.objects["configmaps"][f"{NS}/{record_name(A)}"]
        assert record_of(obj).group == A
        assert fake.patches == []  # no pod is patched: records live in gpupack's namespace
        leader_node = res.slots[0].node
        with r1.cache.lock:
            req = r1.cache.pending_pod("llm/a-0")
            assert req is not None
            placement = r1.book.bind_member(req, req.uid, leader_node)
            assert placement is not None and not isinstance(placement, str)
        ApiBinder(api(fake)).bind("llm", "a-0", req.uid, leader_node,
                                  placement_annotations(placement, "gpupack"))
        wait_for(lambda: (e := r1.cache.pod_entry("llm/a-0")) is not None
                 and e.node is not None)
    finally:
        r1.stop()
    worker_room = res.slots[1]
    fake.put("pods", lws_pod("a", 1, 2, 8))
    r2 = Replica(fake, clock)
    try:
        wait_for(lambda: r2.cache.pending_pod("llm/a-0-1") is not None)
        r2.book.step()
        got = r2.book.reservations[A]
        assert got.slots[1].node == worker_room.node
        assert got.slots[1].gpus == worker_room.gpus
        owners = [g.whole_owner for n in r2.cache.state.nodes.values() for g in n.gpus]
        assert len([o for o in owners if o]) == 16  # leader's 8 + the worker's held 8, once
    finally:
        r2.stop()


def test_only_the_replica_beside_the_lease_holder_writes(fake: FakeApiServer) -> None:
    fake.put("leases", lease("sched-a", time.time()))
    clock = FakeClock()
    a = Replica(fake, clock, identity="sched-a")
    b = Replica(fake, clock, identity="sched-b")
    try:
        assert a.book.is_leader() and not b.book.is_leader()
        for r in (a, b):
            r.book.step(force=True)
        a.writer.drain()
        b.writer.drain()
        # The leader's one write (a replace that finds nothing, then a create); none
        # from the standby, which never ran a decision.
        assert fake.writes == [("PUT", f"{NS}/{record_name(A)}"),
                               ("POST", f"{NS}/{record_name(A)}")]
        assert b.writer.writes == 0 and b.writer.pending() == {}
        # The standby mirrors the record and holds its room: a warm cache.
        wait_for(lambda: A in b.book.reservations)
        b.book.step(force=True)
        assert b.book.reservations[A].slots == a.book.reservations[A].slots
        # Failover: the lease moves to b's kube-scheduler; a stops writing.
        fake.put("leases", lease("sched-b", time.time()))
        assert a.lease is not None and b.lease is not None
        a.lease.poll()
        b.lease.poll()
        assert b.book.is_leader() and not a.book.is_leader()
        a.writer.submit("stale", {"metadata": {"name": "stale"}})
        assert a.writer.drain() == 0 and a.writer.dropped == 1
    finally:
        a.stop()
        b.stop()


def test_an_expired_lease_leads_nobody(fake: FakeApiServer) -> None:
    fake.put("leases", lease("sched-a", time.time() - 60, duration=15))
    r = Replica(fake, FakeClock(), identity="sched-a")
    try:
        assert not r.book.is_leader()
        r.book.step(force=True)
        assert r.book.reservations == {}  # a standby places nothing
    finally:
        r.stop()
