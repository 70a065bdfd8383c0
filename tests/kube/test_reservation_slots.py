"""kube/groups/reservations.py ``decode_reservation``: a record's members are exactly slots 0 to
size-1 (a record that skips one would hold room for fewer members than the group has)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import node
from test_groups_builders import lws_pod, rig

from kube.groups.reservations import (
    RECORD_KEY,
    ReservationError,
    ReservationRecord,
    decode_reservation,
    encode_reservation,
)
from packing.model import Placement

A = "llm/a/0"
TWO = [node("n1", reconfigurable=False), node("n2", reconfigurable=False)]


def record(slots: dict[int, Placement], size: int = 2) -> ReservationRecord:
    return ReservationRecord(
        group=A, size=size, priority=0, topology_key=None, exclusive=False, domain=None,
        first_seen=1000.0, expires=1100.0, rev=1, slots=slots, pods={})


@pytest.mark.parametrize("slots,missing", [
    ({1: Placement("", "n2", (0,))}, 0),
    ({0: Placement("", "n1", (0,))}, 1),
    ({0: Placement("", "n1", (0,)), 2: Placement("", "n2", (0,))}, 1),
])
def test_a_record_that_skips_a_slot_is_refused_naming_it(slots: dict[int, Placement],
                                                         missing: int) -> None:
    size = 3 if 2 in slots else 2
    with pytest.raises(ReservationError, match=rf"'m' \(members\) lacks slot {missing}"):
        decode_reservation(encode_reservation(record(slots, size)))


def test_a_record_with_every_slot_decodes() -> None:
    rec = record({0: Placement("", "n1", (0,)), 1: Placement("", "n2", (1,))})
    assert decode_reservation(encode_reservation(rec)) == rec


def test_a_listed_record_that_skips_a_slot_is_ignored_and_the_group_placed_whole() -> None:
    r0 = rig(TWO, [lws_pod("a", 0, 2, 8)])
    obj: dict[str, Any] = json.loads(json.dumps(r0.writer.last(A)))
    body = json.loads(obj["data"][RECORD_KEY])
    del body["m"]["0"]  # the leader's slot left out
    obj["data"][RECORD_KEY] = json.dumps(body)
    r = rig(TWO, [lws_pod("a", 0, 2, 8)], records=[obj])
    assert r.book.bad_records == 1
    assert sorted(r.book.reservations[A].slots) == [0, 1]
    assert r.held(A) == [0, 1]

