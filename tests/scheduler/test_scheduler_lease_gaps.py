"""Leadership checked again inside a step, and writes a lapse of the lease lost written
again (review of the leader gaps):

* the MIG actuator checks ``is_leader`` right before every API write of a step (the
  ConfigMap, inside its update; the label; each Event): a lease lost during the slow
  decision writes nothing;
* a ConfigMap update keeps another writer's change it re-read, and never brings back a
  change this leader ended;
* MIG compaction asks before each eviction, and writes its memory again when the
  writer dropped it during a lapse;
* the reservation book writes a record again when the API shows it other than memory
  (deleted, or overwritten by a late write of an old leader).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sched_builders import node
from test_compaction_memory import Reader
from test_groups_builders import lws_pod, rig
from test_mig_compact_act import setup as compact_setup
from test_mig_loop import mig_holds
from test_mig_loop import setup as mig_setup

import scheduler.mig.loop as mig_loop
from kube.groups.reservations import record_name, record_object
from kube.mig.compaction_memory import NAME, CompactionMemory, decode
from kube.record_writer import RecordWriter, StaticRecordStore
from packing.mig.plan import WHOLE
from scheduler.mig.changes import Change, changes_json

# ---- MIG actuator ----------------------------------------------------------------------------


def _lose_lease_in_decide(monkeypatch: pytest.MonkeyPatch, lead: list[bool]) -> None:
    """decide_mig (CP-SAT, up to a second) returns after the lease ran out."""
    real = mig_loop.decide_mig

    def slow_decide(*a: Any, **kw: Any) -> Any:
        d = real(*a, **kw)
        lead[0] = False
        return d

    monkeypatch.setattr(mig_loop, "decide_mig", slow_decide)


def test_a_lease_lost_during_the_decision_writes_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache, api, act, _, _ = mig_setup()
    lead = [True]
    act.is_leader = lambda: lead[0]
    _lose_lease_in_decide(monkeypatch, lead)
    d = act.step()
    assert d is not None and d.starts  # it decided to start a change ...
    # ... and handed nothing to the MIG manager: no entry, no changes, no label, no Event.
    assert api.labels == [] and api.config["mig-configs"] == {} and api.changes == ""
    assert api.events == []
    assert mig_holds(cache) == set()
    assert act.step() is None  # the next step is a standby's


def test_a_lease_lost_inside_the_update_aborts_the_write() -> None:
    # MigApi.write reads, calls the update and writes; after a conflict it calls it again.
    # The lease runs out between the read and the update: the update must not return.
    cache, api, act, _, _ = mig_setup()
    lead = [True]
    act.is_leader = lambda: lead[0]
    api.on_write = lambda: lead.__setitem__(0, False)
    act.step()
    assert api.config["mig-configs"] == {} and api.changes == ""
    assert api.labels == [] and api.events == []
    assert mig_holds(cache) == set()


def test_a_lease_lost_between_the_write_and_the_label_labels_nothing() -> None:
    cache, api, act, _, _ = mig_setup()
    lead = [True]
    act.is_leader = lambda: lead[0]
    write = api.write

    def write_then_lose(update: Any) -> None:
        write(update)
        lead[0] = False

    api.write = write_then_lose  # type: ignore[method-assign]
    act.step()
    assert api.config["mig-configs"]  # written (a new leader reads it back as in flight)
    assert api.labels == [] and api.events == []
    assert mig_holds(cache) == set()


def _other_change(node_name: str, started: float) -> Change:
    return Change(node_name, "gpupack-0123456789abcdef", ((0, WHOLE),), ("H100-80GB",),
                  started)


def test_an_update_keeps_the_change_another_writer_made_meanwhile() -> None:
    _, api, act, clock, _ = mig_setup()
    other = _other_change("b", clock())
    # Another replica (leading for a moment) wrote its change after this one read the
    # ConfigMap: this one's write (after the conflict) reads it again.
    api.on_write = lambda: setattr(api, "changes", changes_json({"b": other}))
    act.step()
    written = {c["node"] for c in json.loads(api.changes)}
    assert written == {"a", "b"}, api.changes
    assert act.changes is not None and act.changes["b"] == other  # followed from now on


def test_a_change_this_leader_ended_is_not_brought_back_by_the_re_read() -> None:
    _, api, act, clock, _ = mig_setup(pods=0)
    # A change in flight on a node that is gone: this leader reads it back, ends it
    # (superseded) and writes the changes; the ConfigMap it re-reads still has it.
    api.changes = changes_json({"gone": _other_change("gone", clock() - 10)})
    d = act.step()
    assert d is not None and [f.change.node for f in d.finishes] == ["gone"]
    assert json.loads(api.changes) == []
    assert act.changes == {}


# ---- MIG compaction ----------------------------------------------------------------------------


def test_compaction_evicts_nothing_after_the_lease_was_lost_in_the_same_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lead = [True]
    _, act, evictor, api, _, _, _ = compact_setup(leader=lead)
    _lose_lease_in_decide(monkeypatch, lead)
    act.step()
    assert evictor.asked == [], evictor.asked
    assert not any(r == "MigDrainStarted" for _, r, _ in api.events)


def test_a_compactor_given_its_own_leadership_asks_it_before_evicting() -> None:
    _, act, evictor, *_ = compact_setup()
    assert act.compactor is not None
    act.compactor.is_leader = lambda: False
    act.step()
    assert evictor.asked == []


def test_compaction_memory_dropped_in_a_lapse_is_written_again() -> None:
    lead = [True]
    store = StaticRecordStore()
    writer = RecordWriter(store, is_leader=lambda: lead[0], what="compaction memory",
                          sleep=lambda s: None)
    _, act, evictor, _, _, clock, _ = compact_setup(
        memory=(Reader(CompactionMemory()), writer, "gpupack"), leader=lead)
    act.step()  # the drain starts, one eviction is accepted, the memory is queued
    assert evictor.asked == ["default/lone"]
    lead[0] = False  # a short lapse between two actuator steps, which never see it
    writer.drain()
    assert writer.dropped == 1 and NAME not in store.objects
    lead[0] = True
    clock.advance(1)
    act.step()  # the memory did not change since: written again because it was dropped
    writer.drain()
    kept = store.objects.get(NAME)
    assert kept is not None
    assert decode(kept["data"]["memory.json"]).evictions
    clock.advance(1)
    act.step()  # nothing dropped since, nothing changed: no write
    assert writer.pending() == {}


# ---- reservation book ------------------------------------------------------------------------


def _group_rig() -> Any:
    r = rig([node("a"), node("b")], [lws_pod("vllm", 0, 2, 4), lws_pod("vllm", 1, 2, 4)])
    assert "llm/vllm/0" in r.book.reservations
    return r


def _writes_since(r: Any, n: int, name: str) -> list[Any]:
    return [o for k, o in r.writer.writes[n:] if k == name]


def test_the_leader_writes_again_a_record_another_writer_deleted() -> None:
    r = _group_rig()
    g = "llm/vllm/0"
    name = record_name(g)
    n = len(r.writer.writes)
    r.tap.delete_record(name)  # the old leader's late delete
    again = _writes_since(r, n, name)
    assert again and again[-1] == record_object(r.book.reservations[g], "gpupack")
    assert g in r.book.reservations


def test_the_leader_writes_again_a_record_an_old_write_overwrote() -> None:
    r = _group_rig()
    g = "llm/vllm/0"
    name = record_name(g)
    mine = r.writer.last(g)
    n = len(r.writer.writes)
    # A late write of the old leader: same revision, another room.
    stale = json.loads(json.dumps(mine))
    data = json.loads(stale["data"]["reservation"])
    data["exp"] = data["exp"] - 5
    stale["data"]["reservation"] = json.dumps(data)
    r.tap.upsert_record(stale)
    assert _writes_since(r, n, name) == [mine]
    # The echo of the rewrite equals memory: ignored, nothing written again.
    n = len(r.writer.writes)
    r.tap.upsert_record(mine)
    assert _writes_since(r, n, name) == []


def test_the_leader_deletes_again_a_record_it_released() -> None:
    r = _group_rig()
    g = "llm/vllm/0"
    name = record_name(g)
    mine = r.writer.last(g)
    r.book.records.pop(g)  # released here (as _apply does), its revision kept
    r.book._own_revs[g] = r.book._own_revs.get(g, 0)
    n = len(r.writer.writes)
    r.tap.upsert_record(mine)  # the API still shows it (a late write)
    assert _writes_since(r, n, name) == [None]
    assert g not in r.book.reservations  # a late echo never brings it back


def test_a_standby_mirrors_deletes_and_writes_nothing() -> None:
    lead = [True]
    r = rig([node("a"), node("b")], [lws_pod("vllm", 0, 2, 4), lws_pod("vllm", 1, 2, 4)],
            leader=lambda: lead[0])
    g = "llm/vllm/0"
    r.tap.upsert_record(r.writer.last(g))  # the watch shows it (its echo)
    lead[0] = False
    n = len(r.writer.writes)
    r.tap.delete_record(record_name(g))
    assert g not in r.book.reservations and r.writer.writes[n:] == []
