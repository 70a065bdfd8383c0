"""kube/source.py's static source keeps its objects JSON-encoded (issue 17 item 6): what
it hands out and feeds must be what the files said, exactly, and a read must be a copy."""

from __future__ import annotations

import datetime
import json
import math
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "scheduler"))
from sched_builders import node, whole_pod

from kube.cache import ClusterCache
from kube.source import BindError, Codec, Decoded, PodStore, StaticSource


@pytest.mark.parametrize(("obj", "as_bytes"), [
    ({"metadata": {"name": "a"}, "spec": {"x": [1, 2.5, None, True, "s"]}}, True),
    ({"metadata": {"name": "a", "creationTimestamp": datetime.datetime(2026, 1, 1)}}, False),
    ({"metadata": {"name": "a", "labels": {1: "int key"}}}, False),
    ({"spec": {"ratio": math.inf}}, False),
    ({"spec": {"big": 2**70}}, False),
], ids=["json", "yaml-date", "int-key", "infinity", "big-int"])
def test_encode_keeps_exactly_what_it_was_given(obj: dict[str, Any], as_bytes: bool) -> None:
    codec = Codec()
    codec.encode({"metadata": {"name": "first"}, "spec": {}})  # the preset dictionary
    kept = codec.encode(obj)
    assert isinstance(kept, bytes) is as_bytes
    back = codec.decode(kept)
    assert back == obj and back is not obj
    assert codec.decode(kept) is not back  # every read is a fresh object


def test_similar_objects_keep_small() -> None:
    codec = Codec()
    pods = [whole_pod(f"pod-{i}", 1 + i % 4, uid=f"uid-{i:05d}") for i in range(200)]
    kept = [codec.encode(p) for p in pods]
    assert all(isinstance(k, bytes) for k in kept)
    assert [codec.decode(k) for k in kept] == pods
    raw = sum(len(json.dumps(p)) for p in pods)
    assert sum(len(k) for k in kept if isinstance(k, bytes)) < raw / 4


def test_a_read_is_a_copy_until_stored_again() -> None:
    store = PodStore([whole_pod("p0", 1, uid="u0")])
    pod = store["default/p0"]
    pod["spec"]["nodeName"] = "elsewhere"
    assert "nodeName" not in store["default/p0"]["spec"]
    store["default/p0"] = pod
    assert store["default/p0"]["spec"]["nodeName"] == "elsewhere"
    assert list(store) == ["default/p0"] and len(store) == 1
    del store["default/p0"]
    assert store.get("default/p0") is None


class CountingSink:
    """A sink that records what it was fed and how many objects were alive as dicts at
    once (a Decoded collection must hand them out one at a time)."""

    def __init__(self) -> None:
        self.cache = ClusterCache("gpupack")
        self.max_held = 0

    def replace(self, nodes: Any, pods: Any) -> None:
        assert isinstance(nodes, Decoded) and isinstance(pods, Decoded)
        it: Iterator[dict[str, Any]] = iter(pods)
        first = next(it)
        second = next(it)
        assert first is not second and first["metadata"]["name"] == "p0"
        self.cache.replace(nodes, pods)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)


def test_start_feeds_the_files_objects_and_binds_still_work() -> None:
    pods = [whole_pod("p0", 1, uid="u0"), whole_pod("p1", 1, uid="u1", node="gpu-a")]
    source = StaticSource([node("gpu-a", gpus=2, reconfigurable=False)], pods)
    sink = CountingSink()
    source.start(sink)  # type: ignore[arg-type]
    cache = sink.cache
    assert cache.synced and cache.counts()["pods"] == 2
    assert cache.pending_pod("default/p0") is not None
    source.binder().bind("default", "p0", "u0", "gpu-a", {"gpupack.io/x": "1"})
    stored = source.pods["default/p0"]
    assert stored["spec"]["nodeName"] == "gpu-a"
    assert stored["metadata"]["annotations"]["gpupack.io/x"] == "1"
    assert cache.pending_pod("default/p0") is None  # fed back as the watch would
    with pytest.raises(BindError, match="already assigned"):
        source.binder().bind("default", "p1", "u1", "gpu-a", {})
    with pytest.raises(BindError, match="Precondition failed"):
        source.binder().bind("default", "p0", "other-uid", "gpu-a", {})
    # A pod only a request showed joins the static cluster, as before.
    new = whole_pod("p2", 1, uid="u2")
    source.binder().bind("default", "p2", "u2", "gpu-a", {}, pod=new)
    assert source.pods["default/p2"]["spec"]["nodeName"] == "gpu-a"
    assert "nodeName" not in new["spec"]  # the request's object is left alone


def test_from_files_reads_json_and_yaml(tmp_path: Path) -> None:
    import yaml

    n = node("gpu-a", gpus=2, reconfigurable=False)
    p = whole_pod("p0", 1, uid="u0")
    (tmp_path / "n.json").write_text(json.dumps({"kind": "NodeList", "items": [n]}))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(p))
    source = StaticSource.from_files(tmp_path / "n.json", tmp_path / "p.yaml")
    assert list(source.nodes) == [n]
    assert dict(source.pods) == {"default/p0": p}
    assert isinstance(source.pods, Mapping)
