"""LLM leader/worker groups: whole-group reservations (docs/groups.md).

``decide`` is the reservation book's pure decision (records, pods, holds, now -> records
to write or release), ``loop`` the book that applies it on the leader, ``rights`` what a
group may reserve (pure), ``facts`` the rights' inputs read from the cache, ``keys`` the
hold keys and wait reasons, ``plugin`` the group members' answers at each extension
point. The pure placement itself is :mod:`packing.groups`; the records' API I/O
:mod:`kube.groups`.

May import, of :mod:`scheduler`: the shared helpers and :mod:`scheduler.extender`'s
wire types, view lag and pod reader (``plugin`` answers at its extension points).
Never :mod:`scheduler.mig` nor :mod:`scheduler.defrag`.
"""
