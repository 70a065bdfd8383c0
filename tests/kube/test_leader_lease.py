"""Following kube-scheduler's Lease (kube.leader): a Lease that cannot be judged (a
field out of range, a float overflow) leads nobody, says why naming the field, and
never stops the polling thread."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import pytest

from kube.leader import LeaseWatcher, holds_lease, lease_problem

RENEWED = "2026-01-01T00:00:00.000000Z"
T0 = 1767225600.0  # RENEWED as epoch seconds


def lease(**spec: Any) -> dict[str, Any]:
    return {"spec": {"holderIdentity": "me_1", "renewTime": RENEWED,
                     "leaseDurationSeconds": 15, **spec}}


def test_a_readable_lease_leads_until_it_runs_out() -> None:
    assert holds_lease(lease(), "me", T0 + 14)
    assert not holds_lease(lease(), "me", T0 + 15)
    assert not holds_lease(lease(), "other", T0)
    assert lease_problem(lease()) is None
    assert lease_problem({"spec": {"holderIdentity": ""}}) is None  # nobody holds it


@pytest.mark.parametrize(("spec", "field"), [
    ({"leaseDurationSeconds": 10**400}, "spec.leaseDurationSeconds"),
    ({"leaseDurationSeconds": 2**31}, "spec.leaseDurationSeconds"),
    ({"leaseDurationSeconds": 0}, "spec.leaseDurationSeconds"),
    ({"leaseDurationSeconds": "15"}, "spec.leaseDurationSeconds"),
    ({"leaseDurationSeconds": True}, "spec.leaseDurationSeconds"),
    ({"renewTime": "yesterday"}, "spec.renewTime"),
    ({"holderIdentity": 7}, "spec.holderIdentity"),
])
def test_an_unreadable_lease_leads_nobody_and_names_the_field(spec: dict[str, Any],
                                                              field: str) -> None:
    bad = lease(**spec)
    assert not holds_lease(bad, "me", T0)  # no OverflowError either
    why = lease_problem(bad)
    assert why is not None and why.startswith(field + ":"), why


class Resp:
    def __init__(self, obj: Any) -> None:
        self.data = json.dumps(obj).encode()


class Coordination:
    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def read_namespaced_lease(self, *a: Any, **kw: Any) -> Resp:
        return Resp(self.obj)


def watcher(obj: Any, **kw: Any) -> LeaseWatcher:
    w = LeaseWatcher(None, "ns", "sched", "me", clock=lambda: T0, **kw)
    w.coordination = Coordination(obj)
    return w


def test_a_lease_with_a_huge_duration_keeps_the_thread_alive_as_a_standby(
        caplog: pytest.LogCaptureFixture) -> None:
    w = watcher(lease(leaseDurationSeconds=10**400), poll_s=0.01)
    with caplog.at_level(logging.WARNING, logger="gpupack.kube.leader"):
        w.start()
        time.sleep(0.2)
        assert w._thread is not None and w._thread.is_alive()
        assert w.is_leader() is False
        w.coordination = Coordination(lease())  # mended: leads at the next poll
        deadline = time.monotonic() + 5
        while not w.is_leader() and time.monotonic() < deadline:
            time.sleep(0.01)
        w.stop()
    assert w.is_leader()
    said = [r.getMessage() for r in caplog.records if "cannot be judged" in r.getMessage()]
    assert len(said) == 1 and "spec.leaseDurationSeconds" in said[0]  # once per reason


def test_a_failing_on_change_does_not_stop_the_thread() -> None:
    calls: list[bool] = []

    def on_change(leader: bool) -> None:
        calls.append(leader)
        raise RuntimeError("a bug in a listener")

    w = watcher(lease(), poll_s=0.01, on_change=on_change)
    w.start()
    time.sleep(0.1)
    try:
        assert w._thread is not None and w._thread.is_alive() and calls
    finally:
        w.stop()
