"""kube/groups/reservations.py ``decode_reservation`` against hostile or corrupt records,
and the restore of a record whose expiry lies further ahead than the TTL
(scheduler/groups/loop.py)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import FakeClock, node
from test_groups_builders import lws_pod, rig

from kube.groups.reservations import (
    ReservationError,
    ReservationRecord,
    decode_reservation,
    encode_reservation,
)
from packing.model import Placement

TWO = [node("n1", reconfigurable=False), node("n2", reconfigurable=False)]
A = "llm/a/0"


def record_body() -> dict[str, Any]:
    """A valid record (one whole member, one MIG member), as the JSON object."""
    rec = ReservationRecord(
        group=A, size=2, priority=0, topology_key=None, exclusive=False, domain=None,
        first_seen=1000.0, expires=1100.0, rev=3,
        slots={0: Placement("", "n1", (0, 1)), 1: Placement("", "n2", (2,), "1g.10gb", 4, True)},
        pods={0: "llm/a-0"},
    )
    body: dict[str, Any] = json.loads(encode_reservation(rec))
    return body


def test_the_valid_record_decodes() -> None:
    rec = decode_reservation(json.dumps(record_body()))
    assert rec.expires == 1100.0 and rec.first_seen == 1000.0
    assert rec.slots[1] == Placement("", "n2", (2,), "1g.10gb", 4, True)


# ---- times: finite numbers only -------------------------------------------------------------

HUGE_INT = 10**400  # valid JSON, parsed as a Python int, too large for a float


@pytest.mark.parametrize(("key", "value", "shown"), [
    ("exp", float("nan"), "nan"),
    ("exp", float("inf"), "inf"),
    ("exp", float("-inf"), "-inf"),
    ("at", float("nan"), "nan"),
    ("at", float("inf"), "inf"),
    ("at", float("-inf"), "-inf"),
    pytest.param("exp", HUGE_INT, "1000000000", id="exp-10**400"),
    pytest.param("at", HUGE_INT, "1000000000", id="at-10**400"),
])
def test_non_finite_times_are_refused_naming_key_and_value(key: str, value: Any,
                                                           shown: str) -> None:
    body = record_body()
    body[key] = value
    text = json.dumps(body)  # NaN / Infinity / -Infinity: what json.loads accepts back
    with pytest.raises(ReservationError) as e:
        decode_reservation(text)
    msg = str(e.value)
    assert repr(key) in msg and shown in msg, msg


@pytest.mark.parametrize(("key", "value"), [
    ("exp", 0), ("exp", 1e12), ("at", 0.5), ("at", -1.0), ("exp", 1e300),
])
def test_finite_times_are_read(key: str, value: float) -> None:
    # 1e300 is finite: decode_reservation keeps it, the restore caps it (test below).
    body = record_body()
    body[key] = value
    rec = decode_reservation(json.dumps(body))
    assert (rec.expires if key == "exp" else rec.first_seen) == value


# ---- members: node, GPU indices, MIG ----------------------------------------------------------


def member(slot: str, **changes: Any) -> dict[str, Any]:
    body = record_body()
    body["m"][slot].update(changes)
    return body


def slots(m: dict[str, Any]) -> dict[str, Any]:
    body = record_body()
    body["m"] = m
    return body


def top(**changes: Any) -> dict[str, Any]:
    body = record_body()
    body.update(changes)
    return body


@pytest.mark.parametrize(("body", "field", "shown"), [
    # exclusive: a JSON boolean (bool() read "false" and [0] as true)
    (top(x="false"), "'x'", "'false'"),
    (top(x=[0]), "'x'", "[0]"),
    (top(x=1), "'x'", "1"),
    (top(x=None), "'x'", "None"),
    (top(x=True), None, None),
    # revision: a non-negative integer an int64 holds
    (top(rev=-5), "'rev'", "-5"),
    (top(rev=10**40), "'rev'", "1000000000"),
    (top(rev=2**63), "'rev'", str(2**63)),
    (top(rev=True), "'rev'", "True"),
    (top(rev=3.0), "'rev'", "3.0"),
    (top(rev=0), None, None),
    (top(rev=2**63 - 1), None, None),
    # priority: a pod priority, an int32 (negative ones too)
    (top(pr=10**40), "'pr'", "1000000000"),
    (top(pr=-(10**40)), "'pr'", "-1000000000"),
    (top(pr=2**31), "'pr'", str(2**31)),
    (top(pr=-(2**31) - 1), "'pr'", str(-(2**31) - 1)),
    (top(pr=False), "'pr'", "False"),
    (top(pr=-(2**31)), None, None),
    (top(pr=2**31 - 1), None, None),
])
def test_bad_fields_are_refused_naming_field_and_value(
        body: dict[str, Any], field: str | None, shown: str | None) -> None:
    text = json.dumps(body)
    if field is None:  # at the bound: read as written
        rec = decode_reservation(text)
        assert (rec.exclusive, rec.rev, rec.priority) == (body["x"], body["rev"], body["pr"])
        return
    with pytest.raises(ReservationError) as e:
        decode_reservation(text)
    msg = str(e.value)
    assert field in msg and str(shown) in msg, msg


@pytest.mark.parametrize(("body", "field", "shown"), [
    # node names: a non-empty string
    (member("0", n=""), "'n'", "''"),
    (member("0", n=5), "'n'", "5"),
    (member("0", n=None), "'n'", "None"),
    (member("0", n=["n1"]), "'n'", "['n1']"),
    # GPU indices: non-negative ints, not bools, no duplicates
    (member("0", g=[0, 0]), "'g'", "[0, 0]"),
    (member("0", g=[1, 2, 1]), "'g'", "[1, 2, 1]"),
    (member("0", g=[True]), "'g'", "[True]"),
    (member("0", g=[-1]), "'g'", "[-1]"),
    (member("0", g=[1.0]), "'g'", "[1.0]"),
    (member("0", g="0,1"), "'g'", "'0,1'"),
    (member("0", g=[0, "1"]), "'g'", "[0, '1']"),
    # MIG: [profile (non-empty str), start (non-negative int, not bool), created (bool)]
    (member("1", mig=["", 4, True]), "'mig'", "''"),
    (member("1", mig=[None, 4, True]), "'mig'", "None"),
    (member("1", mig=[7, 4, True]), "'mig'", "7"),
    (member("1", mig=["1g.10gb", -1, True]), "'mig'", "-1"),
    (member("1", mig=["1g.10gb", True, True]), "'mig'", "True"),
    (member("1", mig=["1g.10gb", 4.0, True]), "'mig'", "4.0"),
    (member("1", mig=["1g.10gb", "4", True]), "'mig'", "'4'"),
    (member("1", mig=["1g.10gb", 4, 1]), "'mig'", "1"),
    (member("1", mig=["1g.10gb", 4, "yes"]), "'mig'", "'yes'"),
    (member("1", mig=["1g.10gb", 4]), "'mig'", "['1g.10gb', 4]"),
    (member("1", mig={"profile": "1g.10gb"}), "'mig'", "{'profile': '1g.10gb'}"),
    (member("1", g=[2, 3]), "'g'", "[2, 3]"),  # a MIG member is on one GPU
    # the member's pod key: namespace/name
    (member("0", p=""), "'p'", "''"),
    (member("0", p=3), "'p'", "3"),
    (member("0", p="nopod"), "'p'", "'nopod'"),
    (member("0", p="llm/a/0"), "'p'", "'llm/a/0'"),
    (member("0", p="/a-0"), "'p'", "'/a-0'"),
    (member("0", p="llm/"), "'p'", "'llm/'"),
    # slot keys: canonical decimal ("00" and "0" would be one slot)
    (slots({"00": {"n": "n1", "g": [0]}, "0": {"n": "n2", "g": [1]}}), "slot", "'00'"),
    (slots({"01": {"n": "n1", "g": [0]}}), "slot", "'01'"),
    (slots({"+1": {"n": "n1", "g": [0]}}), "slot", "'+1'"),
    (slots({" 1": {"n": "n1", "g": [0]}}), "slot", "' 1'"),
    (slots({"\u0661": {"n": "n1", "g": [0]}}), "slot", "'\u0661'"),
    (slots({"2": {"n": "n1", "g": [0]}}), "slot", "not below 2"),
])
def test_bad_members_are_refused_naming_field_and_value(body: dict[str, Any], field: str,
                                                        shown: str) -> None:
    with pytest.raises(ReservationError) as e:
        decode_reservation(json.dumps(body))
    msg = str(e.value)
    assert field in msg and shown in msg, msg


@pytest.mark.parametrize("body", [
    member("1", mig=["1g.10gb", 0, False]),
    member("0", g=[]),
    member("0", g=[7, 0, 3]),
    member("0", n="node-with.dots-1"),
])
def test_good_members_are_read(body: dict[str, Any]) -> None:
    decode_reservation(json.dumps(body))


def test_a_long_value_is_cut_short_in_the_message() -> None:
    with pytest.raises(ReservationError) as e:
        decode_reservation(json.dumps(member("0", n=["x" * 5000])))
    assert len(str(e.value)) < 300


# ---- restore: an expiry past now + ttl is capped ----------------------------------------------

TTL = 10.0


def restored(exp: Any, clock: FakeClock) -> tuple[Any, dict[str, Any]]:
    """A reservation written by a first book, its ``exp`` replaced, read by a second."""
    r0 = rig(TWO, [lws_pod("a", 0, 2, 8)], clock=clock, ttl=TTL)
    obj = copy.deepcopy(r0.book.writer.last(A))
    assert obj is not None
    body = json.loads(obj["data"]["reservation"])
    body["exp"] = exp(clock.now) if callable(exp) else exp
    obj["data"]["reservation"] = json.dumps(body)
    clock.advance(3)  # a new reservation would have first_seen = now, a restored one 1000
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], clock=clock, ttl=TTL, records=[obj])
    return r, body


@pytest.mark.parametrize(("exp", "expires"), [
    pytest.param(1e300, lambda now: now + TTL, id="1e300"),
    pytest.param(lambda now: now + 1e6, lambda now: now + TTL, id="a-million-seconds"),
    pytest.param(lambda now: now + 3 + TTL + 0.5, lambda now: now + TTL, id="just-past-ttl"),
    pytest.param(lambda now: now + 3 + TTL, lambda now: now + TTL, id="exactly-ttl"),
    pytest.param(lambda now: now + 8, lambda now: now + 5, id="within-ttl"),
])
def test_a_restored_expiry_is_capped_at_now_plus_ttl(exp: Any, expires: Any) -> None:
    clock = FakeClock()
    r, body = restored(exp, clock)
    got = r.book.reservations[A]
    assert got.first_seen == body["at"], "the record was not restored"
    assert got.rev == body["rev"]  # kept as it was: nothing about it changed
    assert got.expires == pytest.approx(expires(clock.now))
    # And the hold ends no later than the TTL: the group's GPUs are released.
    clock.advance(TTL)
    r.sync()
    assert A not in r.book.reservations
    assert r.book.released["expired"] == 1
    assert r.held(A) == []


@pytest.mark.parametrize("exp", [float("nan"), float("inf"),
                                 pytest.param(HUGE_INT, id="10**400")])
def test_a_non_finite_expiry_is_not_restored(exp: Any) -> None:
    clock = FakeClock()
    r, body = restored(exp, clock)
    got = r.book.reservations[A]  # placed afresh, with a TTL of its own
    assert got.first_seen == clock.now != body["at"]
    assert got.expires == clock.now + TTL
