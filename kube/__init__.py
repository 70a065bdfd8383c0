"""The only Kubernetes I/O: objects read into the model, the cluster cache, API writes.

Readers of objects (:mod:`kube.objects` pods, :mod:`kube.node_objects` nodes,
:mod:`kube.constraints`, :mod:`kube.quotas`; one reader per annotation in
:mod:`kube.annotations`), the cluster cache (:mod:`kube.cache` and the modules it is made
of), the sources and binders (:mod:`kube.source`, :mod:`kube.api_source`), the
leader-only writer (:mod:`kube.record_writer`), and each feature's own I/O under its name:
:mod:`kube.groups`, :mod:`kube.mig`, :mod:`kube.defrag`. The ``kubernetes`` client is
imported only here.

May import: :mod:`packing` (the model) only.
"""
