"""kube/source.py's watch loop against odd events: ERROR events whose ``code`` is not an
int, DELETED events without a usable name, objects that are not mappings.

Most cases drive ``ApiSource._watch`` / ``_run`` synchronously with a scripted list
function (no server, no threads); the last one goes through the real ``kubernetes``
client and the FAKE API server (tests/kube/fake_apiserver.py)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from fake_apiserver import FakeApiServer
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube.api_source import ApiSource


class RecordingSink:
    """What the source calls, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.synced = False

    def upsert_node(self, obj: Any) -> bool:
        self.calls.append(("upsert_node", obj["metadata"]["name"]))
        return True

    def delete_node(self, name: str) -> None:
        self.calls.append(("delete_node", name))

    def upsert_pod(self, obj: Any) -> bool:
        meta = obj["metadata"]
        self.calls.append(("upsert_pod", f"{meta.get('namespace') or 'default'}/{meta['name']}"))
        return True

    def delete_pod(self, key: str) -> None:
        self.calls.append(("delete_pod", key))

    def replace(self, nodes: Any, pods: Any) -> None:
        self.calls.append(("replace", None))

    def mark_synced(self) -> None:
        self.synced = True

    def note_bad_object(self) -> None:
        self.calls.append(("bad", None))


class Lines:
    """A watch response: the given lines, then the end of the stream."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for line in self.lines:
            yield (line + "\n").encode()

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        pass


class ListBody:
    def __init__(self, rv: str) -> None:
        self.data = json.dumps({"metadata": {"resourceVersion": rv}, "items": []}).encode()


class ScriptedApi:
    """The list function: lists answer with versions 10, 20, ...; watches play the
    scripts in turn, and once they are used up the source is stopped."""

    def __init__(self, source: ApiSource, watches: list[list[str]]) -> None:
        self.source = source
        self.watches = list(watches)
        self.lists = 0
        self.watched_from: list[str | None] = []

    def __call__(self, **kw: Any) -> Any:
        if not kw.get("watch"):
            self.lists += 1
            return ListBody(str(10 * self.lists))
        self.watched_from.append(kw.get("resource_version"))
        if not self.watches:
            self.source._stop.set()
            return Lines([])
        return Lines(self.watches.pop(0))


def scripted(watches: list[list[str]]) -> tuple[ApiSource, ScriptedApi]:
    source = ApiSource(client.ApiClient(client.Configuration()), sleep=lambda s: None)
    api = ScriptedApi(source, watches)
    source._list_fn = lambda kind: api
    return source, api


def ev(etype: str, obj: Any) -> str:
    return json.dumps({"type": etype, "object": obj})


def good(kind: str) -> tuple[str, tuple[str, str]]:
    """An ordinary event after the odd one, and what the sink must see of it."""
    if kind == "nodes":
        obj = {"metadata": {"name": "gpu-ok", "resourceVersion": "77"}}
        return ev("ADDED", obj), ("upsert_node", "gpu-ok")
    obj = {"metadata": {"name": "ok", "namespace": "ns", "resourceVersion": "77"}}
    return ev("ADDED", obj), ("upsert_pod", "ns/ok")


# ---- (a) ERROR events: the code as an int, a string of digits, or anything else ---------------


@pytest.mark.parametrize(("obj", "status"), [
    ({"code": 410, "message": "too old"}, 410),
    ({"code": "410", "message": "too old"}, 410),
    ({"code": " 410 ", "message": "too old"}, 410),
    ({"code": "503"}, 503),
    ({"code": "Gone"}, 500),
    ({"code": "4x0"}, 500),
    ({"code": "410.0"}, 500),
    ({"code": "-410"}, 500),
    ({"code": "٤١٠"}, 500),  # Arabic-Indic digits: str.isdigit says yes, not ASCII
    ({"code": "9" * 5000}, 500),
    ({"code": ""}, 500),
    ({"code": "0"}, 500),
    ({"code": 0}, 500),
    ({"code": 99999}, 500),
    ({"code": 410.0}, 500),
    ({"code": True}, 500),
    ({"code": None}, 500),
    ({"code": ["410"]}, 500),
    ({"code": {"value": 410}}, 500),
    ({}, 500),
    ("Gone", 500),
    ([410], 500),
    (None, 500),
])
def test_error_event_code_becomes_an_int_status(obj: Any, status: int) -> None:
    source, _ = scripted([])
    source._resume["pods"] = "5"
    source._list_fn = lambda kind: lambda **kw: Lines([ev("ERROR", obj)])
    with pytest.raises(ApiException) as e:
        source._watch("pods", RecordingSink())
    assert e.value.status == status
    assert type(e.value.status) is int
    if isinstance(obj, dict) and obj.get("message"):
        assert e.value.reason == obj["message"]


@pytest.mark.parametrize(("code", "relists", "reconnects", "lists"), [
    pytest.param(410, 1, 0, 2, id="int-410"),
    pytest.param("410", 1, 0, 2, id="str-410"),
    pytest.param("Gone", 0, 1, 1, id="str-Gone"),
    pytest.param(None, 0, 1, 1, id="null"),
    pytest.param(["410"], 0, 1, 1, id="list"),
])
def test_error_410_as_a_string_lists_again(code: Any, relists: int, reconnects: int,
                                           lists: int) -> None:
    source, api = scripted([[ev("ERROR", {"kind": "Status", "code": code})]])
    sink = RecordingSink()
    source._run("pods", sink)  # returns once the scripted watches are used up
    assert source.relists["pods"] == relists
    assert source.reconnects["pods"] == reconnects
    assert api.lists == lists
    # 410: the next watch starts from the new list; otherwise it resumes where it was.
    assert api.watched_from[-1] == str(10 * lists)


# ---- (b, c) events that cannot be used: skipped, counted, the watch goes on -------------------


@pytest.mark.parametrize(("kind", "line"), [
    # DELETED without a usable name: must not delete "default/" or "None"
    ("pods", ev("DELETED", {"kind": "Pod"})),
    ("pods", ev("DELETED", {"kind": "Pod", "metadata": None})),
    ("pods", ev("DELETED", {"metadata": {"namespace": "default"}})),
    ("pods", ev("DELETED", {"metadata": {"name": ""}})),
    ("pods", ev("DELETED", {"metadata": {"name": 7, "namespace": "ns"}})),
    ("pods", ev("DELETED", {"metadata": {"name": "x", "namespace": ["ns"]}})),
    ("pods", ev("DELETED", {"metadata": ["name", "x"]})),
    ("pods", ev("DELETED", {"metadata": "x"})),
    ("nodes", ev("DELETED", {"kind": "Node"})),
    ("nodes", ev("DELETED", {"metadata": {}})),
    ("nodes", ev("DELETED", {"metadata": {"name": None}})),
    ("nodes", ev("DELETED", {"metadata": {"name": 7}})),
    ("nodes", ev("DELETED", {"metadata": ["gpu-a"]})),
    # objects that are not mappings, metadata that is a list
    ("pods", ev("ADDED", [1, 2])),
    ("pods", ev("MODIFIED", "a pod")),
    ("pods", ev("ADDED", None)),
    ("pods", ev("DELETED", 5)),
    ("pods", ev("ADDED", {"metadata": ["name", "p"]})),
    ("pods", ev("MODIFIED", {"metadata": {"namespace": "ns"}})),
    ("nodes", ev("ADDED", [{"metadata": {"name": "gpu-a"}}])),
    ("nodes", ev("MODIFIED", {"metadata": [{"name": "gpu-a"}]})),
    ("nodes", ev("BOOKMARK", {"metadata": ["77"]})),
    ("nodes", ev("ADDED", {})),
    # events that are not mappings, or of no known type
    ("pods", "[1, 2]"),
    ("pods", '"ADDED"'),
    ("nodes", "null"),
    ("nodes", "17"),
    ("pods", ev("RENAMED", {"metadata": {"name": "p", "namespace": "ns"}})),
    ("pods", json.dumps({"object": {"metadata": {"name": "p"}}})),
])
def test_unusable_events_are_skipped_counted_and_the_watch_goes_on(kind: str,
                                                                   line: str) -> None:
    source, _ = scripted([])
    source._resume[kind] = "5"
    after, seen = good(kind)
    source._list_fn = lambda k: lambda **kw: Lines([line, after])
    sink = RecordingSink()
    source._watch(kind, sink)  # no exception: the stream was read to its end
    assert sink.calls == [("bad", None), seen]  # the sink counts it with its own
    assert source.bad_events == {"nodes": 0, "pods": 0, kind: 1}
    assert source._resume[kind] == "77"


@pytest.mark.parametrize(("kind", "line", "seen"), [
    ("pods", ev("DELETED", {"metadata": {"name": "p"}}), ("delete_pod", "default/p")),
    ("pods", ev("DELETED", {"metadata": {"name": "p", "namespace": "ns"}}),
     ("delete_pod", "ns/p")),
    ("nodes", ev("DELETED", {"metadata": {"name": "gpu-a"}}), ("delete_node", "gpu-a")),
    ("nodes", ev("MODIFIED", {"metadata": {"name": "gpu-a"}}), ("upsert_node", "gpu-a")),
])
def test_usable_events_still_reach_the_sink(kind: str, line: str,
                                            seen: tuple[str, str]) -> None:
    source, _ = scripted([])
    source._list_fn = lambda k: lambda **kw: Lines([line])
    sink = RecordingSink()
    source._watch(kind, sink)
    assert sink.calls == [seen]
    assert source.bad_events == {"nodes": 0, "pods": 0}


def test_a_bad_event_with_a_version_still_moves_the_resume_point() -> None:
    source, _ = scripted([])
    line = ev("DELETED", {"metadata": {"resourceVersion": "42"}})
    source._list_fn = lambda k: lambda **kw: Lines([line])
    source._watch("pods", RecordingSink())
    assert source._resume["pods"] == "42" and source.bad_events["pods"] == 1


# ---- through the real client and the fake API server ------------------------------------------


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def inject(fake: FakeApiServer, kind: str, etype: str, obj: Any) -> None:
    """A raw event on the open watches, whatever its object looks like."""
    with fake.lock:
        fake.rv += 1
        fake.events.append((fake.rv, kind, etype, obj))
        fake.lock.notify_all()


def test_odd_events_through_the_fake_api_server() -> None:
    fake = FakeApiServer().start()
    fake.put("pods", {"metadata": {"name": "p0", "namespace": "default"}, "spec": {}})
    cfg = client.Configuration()
    cfg.host = fake.url
    source = ApiSource(client.ApiClient(cfg), watch_timeout_s=2, backoff_initial_s=0.01,
                       backoff_max_s=0.05)
    sink = RecordingSink()
    try:
        source.start(sink)
        wait_for(lambda: sink.synced)
        time.sleep(0.2)  # both watches open
        inject(fake, "pods", "DELETED", {"kind": "Pod"})
        inject(fake, "pods", "ADDED", {"metadata": ["p1"]})
        inject(fake, "nodes", "DELETED", {"kind": "Node", "metadata": None})
        inject(fake, "pods", "ERROR", {"kind": "Status", "code": "410", "message": "too old"})
        wait_for(lambda: source.relists["pods"] == 1)
        fake.put("pods", {"metadata": {"name": "after", "namespace": "default"}, "spec": {}})
        wait_for(lambda: ("upsert_pod", "default/after") in sink.calls)
    finally:
        source.stop()
        fake.stop()
    assert source.bad_events == {"nodes": 1, "pods": 2}
    assert not any(c[0].startswith("delete") for c in sink.calls), sink.calls
    assert source.reconnects == {"nodes": 0, "pods": 0}


# ---- pacing and stopping: relists, quick watches, back-off, stop() ------------------------


def _paced(sleeps: list[float]) -> ApiSource:
    return ApiSource(client.ApiClient(client.Configuration()), sleep=sleeps.append,
                     backoff_initial_s=0.2, backoff_max_s=30.0)


def test_a_410_that_keeps_coming_relists_with_backoff() -> None:
    # Every watch answered 410 and each one listed the whole cluster again at once: a
    # list storm on the API server. The first relist is immediate, later ones pause.
    sleeps: list[float] = []
    source = _paced(sleeps)
    lists = 0

    def api(**kw: Any) -> Any:
        nonlocal lists
        if not kw.get("watch"):
            lists += 1
            if lists >= 6:
                source._stop.set()
            return ListBody(str(lists))
        return Lines([ev("ERROR", {"kind": "Status", "code": 410, "message": "too old"})])

    source._list_fn = lambda kind: api
    source._run("pods", RecordingSink())
    assert lists == 6 and len(sleeps) == 4  # no pause before the first relist


def _watches(source: ApiSource, scripts: list[list[str]]) -> Callable[..., Any]:
    """The list function: a list at version 10; watches play ``scripts`` in turn, and
    once they are used up the source is stopped."""
    def api(**kw: Any) -> Any:
        if not kw.get("watch"):
            return ListBody("10")
        if not scripts:
            source._stop.set()
            return Lines([])
        return Lines(scripts.pop(0))
    return api


def test_a_watch_that_ends_at_once_without_events_backs_off() -> None:
    # A proxy that closes every watch at once: the loop reopened it back to back.
    sleeps: list[float] = []
    source = _paced(sleeps)
    api = _watches(source, [[] for _ in range(5)])
    source._list_fn = lambda kind: api
    source._run("pods", RecordingSink())
    assert len(sleeps) == 5 and source.reconnects["pods"] == 5


def test_a_watch_that_delivered_resets_the_backoff() -> None:
    sleeps: list[float] = []
    source = _paced(sleeps)
    api = _watches(source, [[], [], [ev("BOOKMARK", {"metadata": {"resourceVersion": "11"}})],
                            []])
    source._list_fn = lambda kind: api
    source._run("pods", RecordingSink())
    # two quick empty watches (0.2, then 0.4 at most), a delivering one, one more quick
    # one: back at the first step.
    assert len(sleeps) == 3 and sleeps[2] <= 0.2


def test_a_long_quiet_watch_resets_the_backoff() -> None:
    # Errors had doubled the pause; then a watch stayed open until the server's time-out
    # without an event (a quiet cluster): the connection works, so the next error
    # pauses from the first step again, not from where the last trouble left it.
    sleeps: list[float] = []
    now = [0.0]
    source = ApiSource(client.ApiClient(client.Configuration()), sleep=sleeps.append,
                       backoff_initial_s=0.2, backoff_max_s=30.0, clock=lambda: now[0])
    watches = 0

    def api(**kw: Any) -> Any:
        nonlocal watches
        if not kw.get("watch"):
            return ListBody("10")
        watches += 1
        if watches <= 4 or watches == 6:
            raise ApiException(status=500, reason="boom")
        if watches == 5:
            now[0] += 300.0  # open for five minutes, nothing happened
            return Lines([])
        source._stop.set()
        return Lines([])

    source._list_fn = lambda kind: api
    source._run("pods", RecordingSink())
    assert len(sleeps) == 5
    assert sleeps[3] > 0.8  # 0.2, 0.4, 0.8, 1.6 (jittered down to half at most)
    assert sleeps[4] <= 0.2


def test_empty_watches_between_410s_do_not_reset_the_relist_backoff() -> None:
    # Each watch is held 1.5 s without an event, the next one answered 410: without a
    # delivering watch in between, the relists keep backing off.
    sleeps: list[float] = []
    now = [0.0]
    source = ApiSource(client.ApiClient(client.Configuration()), sleep=sleeps.append,
                       backoff_initial_s=0.2, backoff_max_s=30.0, clock=lambda: now[0])
    lists = watches = 0

    def api(**kw: Any) -> Any:
        nonlocal lists, watches
        if not kw.get("watch"):
            lists += 1
            if lists > 10:
                source._stop.set()
            return ListBody("10")
        watches += 1
        if watches % 2:
            now[0] += 1.5
            return Lines([])
        return Lines([ev("ERROR", {"kind": "Status", "code": 410, "message": "too old"})])

    source._list_fn = lambda kind: api
    source._run("pods", RecordingSink())
    assert len(sleeps) == 9 and sleeps[-1] > 10.0, sleeps


def test_stop_ends_a_backoff_pause_at_once() -> None:
    # The default pause was time.sleep: up to backoff_max_s (30 s) after stop().
    source = ApiSource(client.ApiClient(client.Configuration()), backoff_initial_s=20.0)

    def api(**kw: Any) -> Any:
        raise ApiException(status=500, reason="boom")

    source._list_fn = lambda kind: api
    source.start(RecordingSink())
    time.sleep(0.3)  # both threads in a 10-20 s pause now
    source.stop()
    assert source.join(2.0)


class _BlockingWatch:
    """A watch response that blocks until it is closed (or 10 s)."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        self.closed.wait(10)
        return iter(())

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()


def test_stop_during_a_list_leaves_no_watch_open() -> None:
    # stop() closed the watches open then; the list in flight went on to open one more,
    # which nothing closed: the thread waited for an event or the watch's time-out.
    source = ApiSource(client.ApiClient(client.Configuration()), backoff_initial_s=0.01)
    in_list = threading.Event()

    def api(**kw: Any) -> Any:
        if not kw.get("watch"):
            in_list.set()
            time.sleep(0.5)
            return ListBody("10")
        return _BlockingWatch()

    source._list_fn = lambda kind: api
    source.start(RecordingSink())
    assert in_list.wait(5)
    source.stop()
    assert source.join(3.0)
