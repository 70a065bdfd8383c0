"""The kube-scheduler extender: HTTP verbs, cluster cache, planner, LWS groups, defrag.

May import: :mod:`packing` (the model and solvers), :mod:`kube` (Kubernetes I/O) and
:mod:`serving` (listeners, TLS). Not :mod:`webhook`: the extender and the webhook stand
side by side; :mod:`gpupack` wires them into one process when asked
(``gpupack serve --webhook-port``).
"""
