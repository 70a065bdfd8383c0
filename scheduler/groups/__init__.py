"""LLM leader/worker groups: whole-group reservations (docs/groups.md).

``decide`` is the reservation book's pure decision (records, pods, holds, now -> records
to write or release), ``loop`` the book that applies it on the leader, ``rights`` what a
group may reserve (pure), ``namespace_cap`` what one namespace's reservations may hold
(pure), ``facts`` the rights' inputs read from the cache, ``keys`` the hold keys and wait
reasons, ``pod_groups`` a PodGroup's group as its PodGroup says (pure), ``plugin`` the
groups' participant at the extender's extension points, ``metrics`` the book's figures.
The pure placement itself is
:mod:`packing.groups`; the records' API I/O :mod:`kube.groups`.

May import, of :mod:`scheduler`: :mod:`scheduler.extender` (``plugin`` takes part at its
extension points: the wire types, the request's cycle, the view lag) and the shared
helpers. Never :mod:`scheduler.mig` nor :mod:`scheduler.defrag`.
"""
