"""Node state signatures: small integers that name what a verb's answer for a node can
depend on, so that nodes in equal states share memoised answers.

A signature is interned from :func:`node_signature` (everything about a node's state
except its name, labels and which pods own what). Ids are never reused for another
state: when the table is forgotten past :data:`SIGNATURE_LIMIT`, a state that comes back
gets a fresh id and costs one memo miss, never a wrong answer. :class:`SignatureBook`
keeps each node's id, recomputed only for the nodes an event touched, and the list of
changes since the last drain (what the memo warmer works from). Not thread-safe on its
own: the cluster cache calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packing.state import NodeState

# Signatures remembered for interning; past this the table is forgotten (ids are never
# reused, so a forgotten state that comes back only costs a fresh id and memo miss).
SIGNATURE_LIMIT = 100_000


def node_signature(n: NodeState) -> tuple[Any, ...]:
    """Everything about a node's state that fit, reasons and scores can depend on, except
    the node's name and labels (node selectors are checked by the verbs themselves).

    Pod identities are left out: which pod owns a GPU never changes what another pod can
    get or how a scorer rates it; whether it is owned, and how much is used, does.
    """
    info = n.info
    return (
        info.cpu_milli, info.memory_mib, info.unschedulable, info.mig_reconfigure,
        info.share_policy, info.gpus, n.cpu_free, n.mem_free,
        tuple(
            (
                g.whole_owner is not None,
                tuple(sorted((s, p, o is None) for s, (p, o) in g.instances.items()))
                if g.instances else (),
                tuple(sorted((m, mem, k in n.unsure) for k, (m, mem) in g.shared_owners.items()))
                if g.shared_owners else (),
                g.reconfigurable,
                g.converted,
            )
            for g in n.gpus
        ),
    )



class SignatureBook:
    """Each node's signature id, interned, refreshed lazily for touched nodes."""

    def __init__(self) -> None:
        self._sig: dict[str, int] = {}  # node -> signature id
        self._ids: dict[tuple[Any, ...], int] = {}  # node_signature -> id
        self._next = 0
        self._dirty: set[str] = set()  # nodes whose signature must be recomputed
        # (node, new signature) since the last drain; None: too many to list
        self._changes: list[tuple[str, int]] | None = []

    def touch(self, node: str) -> None:
        """Something on ``node`` changed (or it was added or removed)."""
        self._dirty.add(node)

    def intern(self, key: tuple[Any, ...]) -> int:
        sid = self._ids.get(key)
        if sid is None:
            if len(self._ids) >= SIGNATURE_LIMIT:
                self._ids.clear()
            self._next += 1
            sid = self._ids[key] = self._next
        return sid

    def refresh(self, nodes: Mapping[str, NodeState]) -> None:
        """Recompute the signatures of the nodes touched since the last refresh."""
        if not self._dirty:
            return
        for name in self._dirty:
            n = nodes.get(name)
            if n is None:
                self._sig.pop(name, None)
                continue
            sid = self.intern(node_signature(n))
            if self._sig.get(name) != sid:
                self._sig[name] = sid
                if self._changes is not None:
                    self._changes.append((name, sid))
                    if len(self._changes) > SIGNATURE_LIMIT:
                        self._changes = None
        self._dirty.clear()

    def current(self, nodes: Mapping[str, NodeState]) -> Mapping[str, int]:
        """Node -> signature id for every node, refreshed first."""
        self.refresh(nodes)
        return self._sig

    def drain(self, nodes: Mapping[str, NodeState]) -> list[tuple[str, int]] | None:
        """The changes since the last drain (None: too many), refreshed first."""
        self.refresh(nodes)
        out, self._changes = self._changes, []
        return out
