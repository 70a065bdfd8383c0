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
from kube.api_source import ApiBinder, ApiSource
from kube.cache import ClusterCache
from kube.groups.inputs import GroupInputs
from kube.groups.lws import LwsPoller
from kube.groups.reservations import RECORD_SELECTOR, ReservationTap, record_name, record_of
from kube.leader import LeaseWatcher
from kube.record_writer import ApiRecordStore, RecordWriter
from packing.status import Status
from scheduler.groups.loop import ReservationBook
from scheduler.groups.plugin import GroupVerbs

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
                 rights: bool = False) -> None:
        client = api(fake)
        # rights: ResourceQuotas watched and LeaderWorkerSets polled, as `gpupack serve`.
        self.inputs = GroupInputs() if rights else None
        self.lws = LwsPoller(client, self.inputs, interval_s=0.2, min_gap_s=0.05) \
            if self.inputs is not None else None
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
                                    retry_s=0, is_leader=leader, namespace=NS,
                                    inputs=self.inputs)
        self.source = ApiSource(client, watch_timeout_s=2, backoff_initial_s=0.01,
                                backoff_max_s=0.05, records_namespace=NS,
                                records_selector=RECORD_SELECTOR, watch_quotas=rights)
        tap = ReservationTap(self.cache, self.book)
        if self.lws is not None:
            self.lws.start()
        self.source.start(tap, tap, self.inputs)
        wait_for(lambda: self.book.ready)

    def stop(self) -> None:
        self.source.stop()
        if self.lws is not None:
            self.lws.stop()


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
            placement = GroupVerbs(r1.book).reserve(req, req.uid, leader_node)
            assert placement is not None and not isinstance(placement, Status)
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


def quota(hard: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "llm", "name": "gpus"},
            "spec": {"hard": {"requests.nvidia.com/gpu": hard}}}


def test_quota_and_lws_reach_the_book_through_the_api(fake: FakeApiServer) -> None:
    """Without the LeaderWorkerSet CRD (404) the book is still ready; the quota watched
    from the API refuses the group until it is raised; then, with the CRD installed, the
    object's size (1) wins over the pod's label (2)."""
    fake.put("resourcequotas", quota("8"))
    clock = FakeClock()
    r = Replica(fake, clock, rights=True)
    try:
        assert r.lws is not None and r.lws.installed is False
        r.book.step(force=True)
        assert A not in r.book.reservations
        assert "ResourceQuota llm/gpus allows (8)" in r.book.waiting[A].reason
        fake.put("resourcequotas", quota("16"))
        wait_for(lambda: r.inputs is not None and r.inputs.quotas("llm")[0].hard == {
            "nvidia.com/gpu": 16})
        clock.advance(1)
        r.book.step(force=True)
        assert r.book.reservations[A].size == 2
        fake.put("leaderworkersets", {
            "metadata": {"namespace": "llm", "name": "a"},
            "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 1}}})
        fake.lws_installed = True
        wait_for(lambda: r.inputs is not None and r.inputs.lws("llm", "a") is not None)
        # The record stays (its size was right when written); a new group of this LWS
        # would be sized 1. The rights now say 1:
        from scheduler.groups.facts import judge

        with r.cache.lock:
            got = judge(r.cache, r.book.inputs, r.book.rights, [A], r.book.records)
        assert got.rights[A].size == 1
    finally:
        r.stop()
