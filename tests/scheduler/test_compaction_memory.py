"""MIG compaction's memory across leaders (kube/compaction_memory.py): the codec, whose
errors name the field, and the handler, which reads it back before it moves anything
and writes it when the evictions of the last hour or the cool-downs change."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_groups_builders import RecordingWriter
from test_mig_compact_act import setup

from kube.compaction_memory import (
    NAME,
    CompactionMemory,
    CompactionMemoryError,
    decode,
    encode,
    memory_object,
)


def test_round_trip_and_what_still_matters() -> None:
    mem = CompactionMemory((100.0, 3000.0), {("a", 0): 5000.0, ("b", 3): 900.0})
    assert decode(encode(mem)) == mem
    assert mem.within(3750.0) == CompactionMemory((3000.0,), {("a", 0): 5000.0})
    obj = memory_object(mem, "gpupack")
    assert obj["metadata"]["name"] == NAME and decode(obj["data"]["memory.json"]) == mem


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
]


@pytest.mark.parametrize(("text", "says"), BAD)
def test_unreadable_memory_names_the_field(text: Any, says: str) -> None:
    with pytest.raises(CompactionMemoryError) as e:
        decode(text)
    assert says in str(e.value)


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
