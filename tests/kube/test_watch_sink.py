"""One watch-sink protocol (kube.source.Sink): the sink ``gpupack serve`` hands the API
source (the reservation tap in front of the cache) takes every call the source makes,
``note_bad_object`` included. A malformed watch event used to raise AttributeError in
the tap and the source relisted everything in a loop."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")
from kubernetes import client

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import node
from test_groups_builders import rig

from kube.api_source import ApiSource


@pytest.mark.parametrize("event", [
    {"type": "ADDED", "object": "not an object"},
    {"type": "MODIFIED", "object": {"metadata": "not a mapping"}},
    {"type": "ADDED", "object": {"metadata": {}}},
    {"type": "SURPRISE", "object": {"metadata": {"name": "x"}}},
])
def test_a_malformed_event_reaches_the_tap_as_a_bad_object(event: object) -> None:
    r = rig([node("n1")], [])
    source = ApiSource(client.ApiClient())
    for kind in ("nodes", "pods"):
        source._event(kind, event, r.tap)
    assert r.cache.bad_objects == 2
    assert source.bad_events == {"nodes": 1, "pods": 1}
