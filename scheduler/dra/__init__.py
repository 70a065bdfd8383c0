"""Pods with ResourceClaims: placed where kube-scheduler's DRA allocator will put their
devices well (docs/dra.md, "What the extender does with DRA").

``decide`` judges one node by the allocator's predicted fit (pure), ``plugin`` is the
participant at the extender's extension points that asks it for every candidate node
and assumes the predicted allocation at bind. The allocator model itself is
:mod:`packing.dra`; the cluster's DRA objects are the cache's (:mod:`kube.dra_store`).

May import, of :mod:`scheduler`: :mod:`scheduler.extender` (the wire types, the
request's cycle, the default verbs for device-plugin nodes of a mixed cluster) and
:mod:`scheduler.memo` (the preference of a score). Never :mod:`scheduler.groups`,
:mod:`scheduler.mig` nor :mod:`scheduler.defrag`.
"""
