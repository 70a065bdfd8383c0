"""MIG compaction's memory across leaders (kube/mig/compaction_memory.py): the codec, whose
errors name the field, and the handler, which reads it back before it moves anything
and writes it when the evictions of the last hour or the cool-downs change."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_groups_builders import RecordingWriter
from test_mig_compact_act import drain_holds, setup

from kube.mig.compaction_memory import (
    NAME,
    CompactionMemory,
    CompactionMemoryError,
    DrainRecord,
    decode,
    encode,
    memory_object,
)
from scheduler.mig.compact.decide import DRAIN_PREFIX

DRAIN = DrainRecord("a", 0, "H100-80GB", ("default/lone", "default/two"), 900.0,
                    frozenset({"default/lone"}))


def test_round_trip_and_what_still_matters() -> None:
    other = DrainRecord("b", 1, "A100-80GB", ("x/y",), 950.0, refused="x/y: 429")
    mem = CompactionMemory((100.0, 3000.0), {("a", 0): 5000.0, ("b", 3): 900.0},
                           (other, DRAIN))
    assert decode(encode(mem)).within(0) == mem.within(0)
    assert mem.within(3750.0) == CompactionMemory((3000.0,), {("a", 0): 5000.0},
                                                  (DRAIN, other))
    obj = memory_object(mem, "gpupack")
    assert obj["metadata"]["name"] == NAME
    assert decode(obj["data"]["memory.json"]).within(0) == mem.within(0)


def test_a_memory_written_before_drains_were_kept_reads_without_them() -> None:
    assert decode('{"v": 1, "evictions": [5.0]}') == CompactionMemory((5.0,))


BAD = [
    (None, "data.memory.json: NoneType, not text"),
    ("{", "data.memory.json: not JSON"),
    ("[]", "data.memory.json: list, not an object"),
    ('{"v": 2}', "data.memory.json.v: 2, not 1"),
    ('{"v": 1, "evictions": {}}', "data.memory.json.evictions: not a list"),
    ('{"v": 1, "evictions": ["x"]}', "data.memory.json.evictions[0]: 'x' is not a time"),
    ('{"v": 1, "evictions": [true]}', "data.memory.json.evictions[0]: True is not a time"),
    ('{"v": 1, "cooldown": [1]}', "data.memory.json.cooldown[0]: not an object"),
    ('{"v": 1, "cooldown": [{"node": "", "gpu": 0, "until": 1}]}',
     "data.memory.json.cooldown[0].node: '' is not a node name"),
    ('{"v": 1, "cooldown": [{"node": "a", "gpu": -1, "until": 1}]}',
     "data.memory.json.cooldown[0].gpu: -1 is not a GPU index"),
    ('{"v": 1, "cooldown": [{"node": "a", "gpu": 0, "until": "soon"}]}',
     "data.memory.json.cooldown[0].until: 'soon' is not a time"),
    ('{"v": 1, "drains": {}}', "data.memory.json.drains: not a list"),
    ('{"v": 1, "drains": [7]}', "data.memory.json.drains[0]: not an object"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": "0"}]}',
     "data.memory.json.drains[0].gpu: '0' is not a GPU index"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": 3}]}',
     "data.memory.json.drains[0].model: 3 is not a GPU model"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["p"]}]}',
     "data.memory.json.drains[0].pods: ['p'] is not a list of namespace/name keys"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": []}]}',
     "data.memory.json.drains[0].pods: empty"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["n/p"], '
     '"evicted": ["n/q"], "started": 1}]}',
     "data.memory.json.drains[0].evicted: ['n/q'] not among the drain's pods"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["n/p"], '
     '"started": null}]}', "data.memory.json.drains[0].started: None is not a time"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["n/p"], '
     '"started": 1, "refused": 429}]}', "data.memory.json.drains[0].refused: 429 is not text"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["n/p"], '
     '"started": 1}, {"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["n/q"], '
     '"started": 2}]}', "data.memory.json.drains[1]: a second drain of GPU 0 of a"),
    # Only the integer 1 is the version this module writes.
    ('{"v": true}', "data.memory.json.v: True, not 1"),
    ('{"v": 1.0}', "data.memory.json.v: 1.0, not 1"),
    # Integers no float holds (math.isfinite raised OverflowError on them).
    ('{"v": 1, "evictions": [' + "9" * 400 + "]}",
     "data.memory.json.evictions[0]: an integer too large to be a time"),
    ('{"v": 1, "cooldown": [{"node": "a", "gpu": 0, "until": -' + "9" * 400 + "}]}",
     "data.memory.json.cooldown[0].until: an integer too large to be a time"),
    ('{"v": 1, "drains": [{"node": "a", "gpu": 0, "model": "H100-80GB", "pods": ["n/p"], '
     '"started": ' + "9" * 400 + "}]}",
     "data.memory.json.drains[0].started: an integer too large to be a time"),
    # Nested deeper than the JSON decoder recurses (it raised RecursionError).
    ("[" * 100_000 + "]" * 100_000, "data.memory.json: nested too deeply"),
    ('{"v": 1, "evictions": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "data.memory.json: nested too deeply"),
]


@pytest.mark.parametrize(("text", "says"), BAD)
def test_unreadable_memory_names_the_field(text: Any, says: str) -> None:
    with pytest.raises(CompactionMemoryError) as e:
        decode(text)
    assert says in str(e.value)


NOW = 1000.0
FAR = 1e300


@pytest.mark.parametrize(
    ("mem", "cooldown_s", "kept"),
    [
        # An eviction later than now is one at now: it leaves the budget after the hour.
        (CompactionMemory((NOW - 10, NOW + 5, FAR)), 1800.0,
         CompactionMemory((NOW - 10, NOW, NOW))),
        # A cool-down ends at most cooldown_s from now; a nearer end is kept.
        (CompactionMemory((), {("a", 0): FAR, ("a", 1): NOW + 60, ("b", 0): NOW}), 1800.0,
         CompactionMemory((), {("a", 0): NOW + 1800, ("a", 1): NOW + 60})),
        (CompactionMemory((), {("a", 0): FAR}), 600.0,
         CompactionMemory((), {("a", 0): NOW + 600})),
        # A drain started later than now started now: it times out like any other.
        (CompactionMemory((), {}, (DrainRecord("a", 0, "H100-80GB", ("n/p",), FAR),
                                   DRAIN)), 1800.0,
         CompactionMemory((), {}, (DrainRecord("a", 0, "H100-80GB", ("n/p",), NOW),
                                   DRAIN))),
    ],
)
def test_what_a_reader_takes_is_bounded_at_now(mem: CompactionMemory, cooldown_s: float,
                                               kept: CompactionMemory) -> None:
    got = mem.within(NOW, cooldown_s=cooldown_s)
    assert sorted(got.evictions) == sorted(kept.evictions)
    assert got.cooldown == kept.cooldown
    assert set(got.drains) == set(kept.drains)


class Reader:
    def __init__(self, mem: CompactionMemory | Exception) -> None:
        self.mem = mem
        self.reads = 0

    def read(self) -> CompactionMemory:
        self.reads += 1
        if isinstance(self.mem, Exception):
            raise self.mem
        return self.mem


def test_a_new_leader_counts_the_last_leaders_evictions_against_the_budget() -> None:
    # The budget is 2 an hour; the last leader used both 10 and 20 minutes ago.
    writer = RecordingWriter()
    now = 1000.0  # FakeClock's start
    reader = Reader(CompactionMemory((now - 1200, now - 600)))
    _, act, evictor, *_ = setup(memory=(reader, writer, "gpupack"), per_hour=2)
    act.step()
    assert evictor.asked == [] and reader.reads == 1
    assert writer.writes == []  # nothing changed


def test_without_the_memory_the_same_leader_would_evict() -> None:
    writer = RecordingWriter()
    _, act, evictor, _, _, clock, _ = setup(memory=(Reader(CompactionMemory()), writer,
                                                    "gpupack"), per_hour=2)
    act.step()
    assert evictor.asked == ["default/lone"]
    (name, obj), = writer.writes
    assert name == NAME
    assert json.loads(obj["data"]["memory.json"])["evictions"] == [clock()]


def test_a_remembered_cool_down_keeps_the_gpu_undrained() -> None:
    reader = Reader(CompactionMemory((), {("a", 0): 1000.0 + 1800}))
    _, act, evictor, *_ = setup(memory=(reader, RecordingWriter(), "gpupack"))
    act.step()
    assert evictor.asked == []


def test_an_unreadable_memory_moves_nothing_until_it_is_read() -> None:
    reader = Reader(RuntimeError("503 from the API server"))
    _, act, evictor, _, _, clock, _ = setup(memory=(reader, RecordingWriter(), "gpupack"))
    act.step()
    assert evictor.asked == []
    reader.mem = CompactionMemory()
    clock.advance(1)
    act.step()
    assert evictor.asked == ["default/lone"] and reader.reads == 2


def test_leading_again_reads_the_memory_again() -> None:
    lead = [True]
    reader = Reader(CompactionMemory())
    _, act, *_ = setup(memory=(reader, RecordingWriter(), "gpupack"), leader=lead)
    act.step()
    lead[0] = False
    act.step()
    lead[0] = True
    act.step()
    assert reader.reads == 2


def test_a_new_leader_takes_up_the_last_leaders_drain() -> None:
    # Leader 1 started draining GPU 0 and its eviction of the lone pod was accepted; the
    # pod still terminates when leader 1 goes. The memory it wrote is what leader 2
    # (another replica: another cache, another handler) reads.
    writer = RecordingWriter()
    lead = [True]
    _, act1, evictor1, *_ = setup(memory=(Reader(CompactionMemory()), writer, "gpupack"),
                                  leader=lead)
    act1.step()
    assert evictor1.asked == ["default/lone"]
    written = decode(writer.writes[-1][1]["data"]["memory.json"])
    (rec,) = written.drains
    assert (rec.node, rec.gpu, rec.pods, rec.evicted) == ("a", 0, ("default/lone",),
                                                          frozenset({"default/lone"}))
    lead[0] = False
    act1.step()
    writer2 = RecordingWriter()
    cache, act2, evictor2, api2, _, clock, _ = setup(memory=(Reader(written), writer2,
                                                             "gpupack"))
    act2.step()
    # Not evicted again, and the GPU's free slices are held at once: nothing lands there.
    assert evictor2.asked == []
    assert drain_holds(cache) == {f"{DRAIN_PREFIX}a/0/{s}" for s in range(1, 7)}
    cache.delete_pod("default/lone")  # the pod goes: its slice is held in the same step
    assert cache.state.gpu("a", 0).instances[0][1] == f"{DRAIN_PREFIX}a/0/0"
    clock.advance(1)
    act2.step()
    assert drain_holds(cache) == set() and ("a", "MigDrained", False) in api2.events
    assert decode(writer2.writes[-1][1]["data"]["memory.json"]).drains == ()


def test_a_remembered_drain_whose_pods_were_not_evicted_yet_evicts_them() -> None:
    rec = DrainRecord("a", 0, "H100-80GB", ("default/lone",), 990.0)
    _, act, evictor, *_ = setup(memory=(Reader(CompactionMemory((), {}, (rec,))),
                                        RecordingWriter(), "gpupack"), min_age=300)
    act.step()  # the pod is young to this handler: only the remembered drain moves it
    assert evictor.asked == ["default/lone"]


def test_remembered_evictions_of_one_step_each_count_against_the_budget() -> None:
    # The last leader evicted two pods in one step: two evictions at one time.
    reader = Reader(CompactionMemory((NOW - 600, NOW - 600)))
    _, act, evictor, *_ = setup(memory=(reader, RecordingWriter(), "gpupack"), per_hour=2)
    act.step()
    assert evictor.asked == []


def test_evictions_remembered_in_the_future_leave_the_budget_after_an_hour() -> None:
    reader = Reader(CompactionMemory((1e12, FAR)))
    _, act, evictor, _, _, clock, _ = setup(memory=(reader, RecordingWriter(), "gpupack"),
                                            per_hour=2)
    act.step()
    assert evictor.asked == []
    clock.advance(3601)
    act.step()
    assert evictor.asked == ["default/lone"]


def test_a_cool_down_remembered_for_ever_ends_after_the_configured_cool_down() -> None:
    reader = Reader(CompactionMemory((), {("a", 0): FAR}))
    _, act, evictor, _, _, clock, _ = setup(memory=(reader, RecordingWriter(), "gpupack"))
    act.step()
    assert evictor.asked == []
    clock.advance(1801)  # CompactSettings.cooldown_s
    act.step()
    assert evictor.asked == ["default/lone"]


def test_a_drain_remembered_as_started_in_the_future_times_out() -> None:
    rec = DrainRecord("a", 0, "H100-80GB", ("default/lone",), FAR, frozenset({"default/lone"}))
    cache, act, _, api, _, clock, _ = setup(
        memory=(Reader(CompactionMemory((), {}, (rec,))), RecordingWriter(), "gpupack"),
        per_hour=0)
    act.step()
    assert drain_holds(cache)  # taken up: the GPU's free slices are held
    clock.advance(601)  # CompactSettings.drain_timeout_s: the pod is still there
    act.step()
    assert drain_holds(cache) == set() and ("a", "MigDrainStopped", True) in api.events
