"""Cluster sources for the extender's cache and the binders that create Bindings: what
every source and binder is (the protocols), and the static one.

- :class:`Source`, :class:`Sink`, :class:`Binder`: what a source feeds (Node and Pod
  objects as add/update/delete events, lists, the sync mark) and what binds; the API
  server's are :class:`kube.api_source.ApiSource` and :class:`kube.api_source.ApiBinder`.
- :class:`StaticSource` / :class:`StaticBinder`: the same objects from NODES/PODS files
  (the formats of ``gpupack plan``); binds are applied to the files' objects in memory
  and fed back to the cache, as the watch would.

Objects go to the cache as plain dicts (the API's JSON), which is what
:mod:`kube.objects` reads.
"""

from __future__ import annotations

import copy
import logging
import threading
import zlib
from collections.abc import (
    Collection,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
)
from pathlib import Path
from typing import Any, Protocol

import orjson

from kube.files import load_objects, split_objects
from kube.objects import pod_key

log = logging.getLogger("gpupack.kube.source")


class BindError(RuntimeError):
    """The API server (or the static cluster) refused the Binding."""


class BindUnknown(BindError):
    """The Binding was sent and no answer came back in time (a timeout, a connection
    lost): the API server may still apply it. The bind's GPUs stay assumed until the
    watch shows the pod, or until no request could still apply it
    (:data:`UNKNOWN_BIND_HOLD_S`)."""


# How long a Binding gets before the bind verb gives up on it: below kube-scheduler's
# extender httpTimeout (the chart's 3 s), so that kube-scheduler and gpupack agree on
# the verb's outcome; a bind that answers later is an unknown outcome (BindUnknown),
# not a failure.
BIND_TIMEOUT_S = 2.0
# How long the GPUs of a bind whose outcome is unknown stay assumed: kube-apiserver
# abandons a request after its --request-timeout (1 minute by default), so a Binding not
# applied by then never will be.
UNKNOWN_BIND_HOLD_S = 60.0


class Binder(Protocol):
    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
        pod: Mapping[str, Any] | None = None,
    ) -> None:
        """Bind the pod to the node and record ``annotations`` on it; BindError if refused.

        ``pod``: the Pod object as a filter request showed it, when no list had it (the
        API binder does not need it: the API server has the pod; the static binder adds
        it to its cluster, as the API server would already have it)."""
        ...


class Sink(Protocol):
    """What a source feeds: :class:`kube.cache.ClusterCache` provides it."""

    def upsert_node(self, obj: Mapping[str, Any]) -> bool: ...

    def delete_node(self, name: str) -> None: ...

    def upsert_pod(self, obj: Mapping[str, Any]) -> bool: ...

    def delete_pod(self, key: str) -> None: ...

    def replace(self, nodes: Any, pods: Any) -> None: ...

    def mark_synced(self) -> None: ...

    def note_bad_object(self) -> None:
        """An object the source skipped as unreadable (counted with the sink's own)."""


class RecordSink(Protocol):
    """Where gpupack's own reservation records (ConfigMaps in its namespace) go."""

    def upsert_record(self, obj: Mapping[str, Any]) -> None: ...

    def delete_record(self, name: str) -> None: ...

    def replace_records(self, objs: Any) -> None: ...


class ObjectSink(Protocol):
    """Where the objects of one more kind go (ResourceQuotas: kube.groups.inputs)."""

    def upsert(self, obj: Mapping[str, Any]) -> None: ...

    def delete(self, obj: Mapping[str, Any]) -> None: ...

    def replace(self, objs: list[Mapping[str, Any]]) -> None: ...


class DraSink(Protocol):
    """Where the ``resource.k8s.io`` objects go (:class:`kube.cache.ClusterCache`), by
    kind (the plural resource names of :data:`kube.dra_store.KINDS`)."""

    def upsert_dra(self, kind: str, obj: Mapping[str, Any]) -> bool: ...

    def delete_dra(self, kind: str, key: str) -> None: ...

    def replace_dra(self, kind: str, objs: Iterable[Mapping[str, Any]]) -> None: ...


class Source(Protocol):
    """Where the cluster comes from (:class:`kube.api_source.ApiSource`,
    :class:`StaticSource`): feeds one sink from ``start`` on, until ``stop``;
    ``mark_synced`` once everything it lists (records and quotas too, when it has their
    sinks) has been listed."""

    def start(self, sink: Sink, records: RecordSink | None = None,
              quotas: ObjectSink | None = None, dra: DraSink | None = None) -> None: ...

    def stop(self) -> None: ...


class Codec:
    """How a static source keeps its objects: JSON (orjson), deflated against a preset
    dictionary, the JSON of the first object it was given. Objects of one kind from one
    file differ in little (names, uids, a few values), so a 770-byte pod keeps in ~75
    bytes; encoding or decoding one takes a few microseconds. What JSON cannot say
    exactly (a YAML file's dates, non-string keys, NaN) is kept as a deep copy."""

    def __init__(self) -> None:
        self.zdict: bytes | None = None

    def encode(self, obj: Mapping[str, Any]) -> bytes | dict[str, Any]:
        try:
            data = orjson.dumps(obj, option=orjson.OPT_PASSTHROUGH_DATETIME)
            exact = orjson.loads(data) == obj
        except (TypeError, ValueError):
            exact = False
        if not exact:
            return copy.deepcopy(dict(obj))
        if self.zdict is None:
            self.zdict = data[-32768:]  # deflate's window
        z = zlib.compressobj(1, zdict=self.zdict)
        return z.compress(data) + z.flush()

    def decode(self, data: bytes | dict[str, Any]) -> dict[str, Any]:
        """A new object from what :meth:`encode` kept."""
        if isinstance(data, bytes):
            assert self.zdict is not None
            z = zlib.decompressobj(zdict=self.zdict)
            obj: dict[str, Any] = orjson.loads(z.decompress(data) + z.flush())
            return obj
        return copy.deepcopy(data)


class PodStore(MutableMapping[str, dict[str, Any]]):
    """Pod key -> Pod object, each kept encoded (:class:`Codec`) and decoded afresh on
    every read: a 50,000-pod cluster is ~7 MB here instead of ~250 MB of nested dicts.
    A read returns a new dict, so changing it changes nothing here until it is stored
    again."""

    def __init__(self, pods: Iterable[Mapping[str, Any]] = ()) -> None:
        self._codec = Codec()
        self._data: dict[str, bytes | dict[str, Any]] = {}
        for p in pods:
            self[pod_key(p)] = p

    def __getitem__(self, key: str) -> dict[str, Any]:
        return self._codec.decode(self._data[key])

    def __setitem__(self, key: str, pod: Mapping[str, Any]) -> None:
        self._data[key] = self._codec.encode(pod)

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def objects(self) -> Decoded:
        """Every pod, decoded one at a time as it is iterated."""
        return Decoded(list(self._data.values()), self._codec)


class Decoded(Collection[dict[str, Any]]):
    """Objects kept by a :class:`Codec`, decoded one at a time as they are iterated: a
    sink reading them (:meth:`Sink.replace`) never holds more than one as dicts."""

    def __init__(self, items: Sequence[bytes | dict[str, Any]], codec: Codec) -> None:
        self._items = items
        self._codec = codec

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for data in self._items:
            yield self._codec.decode(data)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, obj: object) -> bool:
        return any(x == obj for x in self)


class StaticSource:
    """Nodes and pods from files; binds change them in memory and are fed back at once.
    The objects are kept JSON-encoded (:class:`PodStore`) and fed to the sink one at a
    time, so the parsed files are never held whole after loading."""

    def __init__(self, nodes: Iterable[Mapping[str, Any]],
                 pods: Iterable[Mapping[str, Any]],
                 dra: Mapping[str, list[dict[str, Any]]] | None = None) -> None:
        # DRA objects by kind (kube.dra_store.KINDS), fed to a DRA sink at start.
        self.dra = dict(dra or {})
        self._node_codec = Codec()
        self._nodes = [self._node_codec.encode(n) for n in nodes]
        self.pods = PodStore(pods)
        self.lock = threading.Lock()
        self.sink: Sink | None = None

    @property
    def nodes(self) -> Decoded:
        return Decoded(self._nodes, self._node_codec)

    @staticmethod
    def from_files(nodes_path: Path, pods_path: Path) -> StaticSource:
        """Read and check both files (ObjectError naming the file, OSError): the one
        place they are parsed. The nodes file may hold the ``resource.k8s.io`` objects of
        Dynamic Resource Allocation too (ResourceSlices, DeviceClasses, ResourceClaims,
        ResourceClaimTemplates, DeviceTaintRules)."""
        from kube.dra_store import KIND_NAMES

        found = split_objects(nodes_path.read_text(encoding="utf-8"), str(nodes_path),
                              ("Node", *KIND_NAMES))
        nodes = found.pop("Node")
        source = StaticSource(nodes, (), {KIND_NAMES[k]: v for k, v in found.items() if v})
        del nodes
        pods = load_objects(pods_path.read_text(encoding="utf-8"), str(pods_path), "Pod")
        source.pods = PodStore(pods)
        return source

    def start(self, sink: Sink, records: RecordSink | None = None,
              quotas: ObjectSink | None = None, dra: DraSink | None = None) -> None:
        # Static records live in kube.record_writer.StaticRecordStore; static mode has no
        # ResourceQuotas (its GroupInputs starts listed and empty).
        del records, quotas
        self.sink = sink
        with self.lock:
            if dra is not None:
                for kind, objs in self.dra.items():
                    dra.replace_dra(kind, objs)
            sink.replace(self.nodes, self.pods.objects())
        sink.mark_synced()

    def stop(self) -> None:
        """Nothing runs in the background."""

    def binder(self) -> StaticBinder:
        return StaticBinder(self)

    def patch_pod_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> None:
        """A JSON merge patch of annotations (None removes a key), fed back as the watch
        would; BindError when the pod does not exist."""
        key = f"{namespace}/{name}"
        with self.lock:
            updated = self.pods.get(key)  # a fresh copy
            if updated is None:
                raise BindError(f'pods "{name}" not found')
            ann = updated.setdefault("metadata", {}).setdefault("annotations", {})
            for k, v in annotations.items():
                if v is None:
                    ann.pop(k, None)
                else:
                    ann[k] = v
            self.pods[key] = updated
        if self.sink is not None:
            self.sink.upsert_pod(updated)


class StaticBinder:
    """Binds like the API server would: UID precondition, no re-binding, annotations merged.
    A pod the files do not have but a request showed (``pod``) joins the static cluster:
    in static mode the files hold the cluster as it was, and new pods arrive only in
    kube-scheduler's requests."""

    def __init__(self, source: StaticSource) -> None:
        self.source = source

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str],
        pod: Mapping[str, Any] | None = None,
    ) -> None:
        key = f"{namespace}/{name}"
        with self.source.lock:
            current = self.source.pods.get(key)  # a fresh copy (PodStore)
            if current is None and pod is not None and pod_key(pod) == key:
                self.source.pods[key] = pod
                current = self.source.pods[key]
            if current is None:
                raise BindError(f'pods "{name}" not found')
            meta = current.setdefault("metadata", {})
            if uid and meta.get("uid") and meta["uid"] != uid:
                raise BindError(
                    f"Precondition failed: UID in precondition: {uid}, "
                    f"UID in object meta: {meta['uid']}"
                )
            spec = current.setdefault("spec", {})
            if spec.get("nodeName"):
                raise BindError(f'pod {name} is already assigned to node "{spec["nodeName"]}"')
            updated = current
            updated["spec"]["nodeName"] = node
            updated["metadata"].setdefault("annotations", {}).update(annotations)
            self.source.pods[key] = updated
        if self.source.sink is not None:
            self.source.sink.upsert_pod(updated)  # what the watch would report next
