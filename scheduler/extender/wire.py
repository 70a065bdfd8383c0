"""kube-scheduler HTTP extender v1 wire types (``k8s.io/kube-scheduler/extender/v1``).

The Go types carry no json tags, so kube-scheduler sends and expects the Go field names,
capitalized; releases before the move to ``k8s.io/kube-scheduler`` used lowercase keys.
Decoding therefore matches keys case-insensitively and encoding always writes the Go
names. ``Nodes`` (a v1.NodeList) and ``NodeNames`` may each be null: which one is set
depends on ``nodeCacheCapable``.

Every decoding error is a :class:`WireError` that names the field and the bad value, so
the HTTP layer can answer 400 with a message a person can act on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_PRIORITY = 10
MIN_PRIORITY = 0


class WireError(ValueError):
    """A request body that does not match the extender v1 contract."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fold(obj: Any, where: str) -> dict[str, Any]:
    """The object's keys lowercased (the scheduler decodes case-insensitively too)."""
    if not isinstance(obj, Mapping):
        raise WireError(f"{where}: expected a JSON object, got {_short(obj)}")
    return {str(k).lower(): v for k, v in obj.items()}


def _pod(obj: Mapping[str, Any], where: str) -> dict[str, Any]:
    if "pod" not in obj or obj["pod"] is None:
        raise WireError(f"{where}.Pod: missing")
    pod = obj["pod"]
    if not isinstance(pod, dict):
        raise WireError(f"{where}.Pod: expected a v1.Pod object, got {_short(pod)}")
    meta = pod.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise WireError(f"{where}.Pod.metadata.name: missing")
    return pod


def _str(obj: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = obj.get(key.lower())
    if value is None:
        if required:
            raise WireError(f"{where}.{key}: missing")
        return ""
    if not isinstance(value, str):
        raise WireError(f"{where}.{key}: expected a string, got {_short(value)}")
    if required and not value:
        raise WireError(f"{where}.{key}: empty")
    return value


def _int(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = obj.get(key.lower(), 0)
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{where}.{key}: expected an integer, got {_short(value)}")
    return value


def _count(obj: Mapping[str, Any], key: str, where: str) -> int:
    value = _int(obj, key, where)
    if value < 0:
        raise WireError(f"{where}.{key}: {value} is negative")
    return value


def _names(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise WireError(f"{where}: expected a list of node names or null, got {_short(value)}")
    for i, v in enumerate(value):
        if not isinstance(v, str) or not v:
            raise WireError(f"{where}[{i}]: expected a node name, got {_short(v)}")
    return tuple(value)


def _node_list(value: Any, where: str) -> tuple[dict[str, Any], ...] | None:
    if value is None:
        return None
    items = _fold(value, where).get("items")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise WireError(f"{where}.items: expected a list of v1.Node, got {_short(items)}")
    out = []
    for i, node in enumerate(items):
        meta = node.get("metadata") if isinstance(node, dict) else None
        if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
            raise WireError(f"{where}.items[{i}].metadata.name: missing")
        out.append(node)
    return tuple(out)


# ---- requests ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExtenderArgs:
    """filter and prioritize request."""

    pod: dict[str, Any]
    nodes: tuple[dict[str, Any], ...] | None  # full Node objects (nodeCacheCapable: false)
    node_names: tuple[str, ...] | None  # names only (nodeCacheCapable: true)

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None

    @property
    def candidate_names(self) -> tuple[str, ...]:
        if self.node_names is not None:
            return self.node_names
        return tuple(n["metadata"]["name"] for n in self.nodes or ())

    @staticmethod
    def decode(obj: Any) -> ExtenderArgs:
        where = "ExtenderArgs"
        d = _fold(obj, where)
        pod = _pod(d, where)
        nodes = _node_list(d.get("nodes"), f"{where}.Nodes")
        names = _names(d.get("nodenames"), f"{where}.NodeNames")
        if nodes is None and names is None:
            raise WireError(f"{where}: neither Nodes nor NodeNames given")
        if nodes is not None and names is not None:
            # Both set happens only in hand-written requests; the names are what the
            # scheduler's cache-capable mode would send, and they must agree.
            if tuple(n["metadata"]["name"] for n in nodes) != names:
                raise WireError(f"{where}: Nodes and NodeNames name different nodes")
            nodes = None
        return ExtenderArgs(pod, nodes, names)


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def pod_key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"

    @staticmethod
    def decode(obj: Any) -> BindingArgs:
        where = "ExtenderBindingArgs"
        d = _fold(obj, where)
        return BindingArgs(
            pod_name=_str(d, "PodName", where),
            pod_namespace=_str(d, "PodNamespace", where, required=False) or "default",
            pod_uid=_str(d, "PodUID", where, required=False),
            node=_str(d, "Node", where),
        )


@dataclass(frozen=True)
class Victims:
    """Candidate victims on one node: full pods, or only their UIDs (meta victims)."""

    pods: tuple[dict[str, Any], ...] = ()
    uids: tuple[str, ...] = ()
    num_pdb_violations: int = 0


@dataclass(frozen=True)
class PreemptionArgs:
    pod: dict[str, Any]
    victims: Mapping[str, Victims] = field(default_factory=dict)
    meta: bool = True  # the victims came as NodeNameToMetaVictims (UIDs only)

    @staticmethod
    def decode(obj: Any) -> PreemptionArgs:
        where = "ExtenderPreemptionArgs"
        d = _fold(obj, where)
        pod = _pod(d, where)
        meta_raw = d.get("nodenametometavictims")
        full_raw = d.get("nodenametovictims")
        out: dict[str, Victims] = {}
        if full_raw is not None:
            full = _fold(full_raw, f"{where}.NodeNameToVictims")
            for node, v in full.items():
                w = f"{where}.NodeNameToVictims.{node}"
                vd = _fold(v, w)
                pods = vd.get("pods") or []
                if not isinstance(pods, list):
                    raise WireError(f"{w}.Pods: expected a list, got {_short(pods)}")
                for i, p in enumerate(pods):
                    if not isinstance(p, dict) or not isinstance(p.get("metadata"), dict):
                        raise WireError(f"{w}.Pods[{i}]: expected a v1.Pod, got {_short(p)}")
                uids = tuple(str(p["metadata"].get("uid") or "") for p in pods)
                pdb = _count(vd, "NumPDBViolations", w)
                out[_orig_key(full_raw, node)] = Victims(tuple(pods), uids, pdb)
        meta = full_raw is None
        if meta_raw is not None and full_raw is None:
            metas = _fold(meta_raw, f"{where}.NodeNameToMetaVictims")
            for node, v in metas.items():
                w = f"{where}.NodeNameToMetaVictims.{node}"
                vd = _fold(v, w)
                pods = vd.get("pods") or []
                if not isinstance(pods, list):
                    raise WireError(f"{w}.Pods: expected a list, got {_short(pods)}")
                meta_uids: list[str] = []
                for i, p in enumerate(pods):
                    uid = _fold(p, f"{w}.Pods[{i}]").get("uid")
                    if not isinstance(uid, str) or not uid:
                        raise WireError(f"{w}.Pods[{i}].UID: expected a UID, got {_short(uid)}")
                    meta_uids.append(uid)
                pdb = _count(vd, "NumPDBViolations", w)
                out[_orig_key(meta_raw, node)] = Victims((), tuple(meta_uids), pdb)
        return PreemptionArgs(pod, out, meta)


def _orig_key(raw: Mapping[str, Any], folded: str) -> str:
    """Node names are map keys: fold only the wrapper keys, never the node names."""
    for k in raw:
        if str(k).lower() == folded:
            return str(k)
    return folded


# ---- responses -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterResult:
    node_names: tuple[str, ...] | None = None
    nodes: tuple[dict[str, Any], ...] | None = None
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)
    error: str = ""

    def encode(self) -> dict[str, Any]:
        return {
            "Nodes": None if self.nodes is None else {
                "apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": list(self.nodes)
            },
            "NodeNames": None if self.node_names is None else list(self.node_names),
            "FailedNodes": dict(self.failed),
            "FailedAndUnresolvableNodes": dict(self.unresolvable),
            "Error": self.error,
        }


@dataclass(frozen=True)
class HostPriority:
    host: str
    score: int

    def encode(self) -> dict[str, Any]:
        return {"Host": self.host, "Score": self.score}


def encode_priorities(items: Sequence[HostPriority]) -> list[dict[str, Any]]:
    return [h.encode() for h in items]


@dataclass(frozen=True)
class BindingResult:
    error: str = ""

    def encode(self) -> dict[str, Any]:
        return {"Error": self.error}


@dataclass(frozen=True)
class MetaVictims:
    uids: tuple[str, ...]
    num_pdb_violations: int = 0

    def encode(self) -> dict[str, Any]:
        return {"Pods": [{"UID": u} for u in self.uids],
                "NumPDBViolations": self.num_pdb_violations}


@dataclass(frozen=True)
class PreemptionResult:
    victims: Mapping[str, MetaVictims] = field(default_factory=dict)

    def encode(self) -> dict[str, Any]:
        return {"NodeNameToMetaVictims": {n: v.encode() for n, v in self.victims.items()}}
