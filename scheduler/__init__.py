"""The kube-scheduler extender and the background work beside it, one room per system.

* :mod:`scheduler.extender`: the HTTP extender (filter, prioritize, bind, preempt): wire
  types, the extension points, the pure verbs, the extender's metrics.
* :mod:`scheduler.memo`: what a pod shape gets on a node state, memoized, and the warmer
  that fills it ahead of requests; the scoring helpers the verbs and the planner share.
* :mod:`scheduler.planner`: the background plan of every pending pod (solver process).
* :mod:`scheduler.groups`: LLM groups: the reservation book and its answers for members.
* :mod:`scheduler.mig`: the MIG actuator, and MIG compaction under it.
* :mod:`scheduler.defrag`: defragmentation for waiting groups.

One naming rule in every system: ``decide.py`` is the pure decision (no I/O, no lock, no
clock: state in, decision out), ``loop.py`` the thin handler that gathers the state,
applies the decision and runs in the background on the one loop engine,
:mod:`scheduler.engine` (thread, stop, bounded join, leader gate, back-off, outcome
metrics). Shared helpers beside the rooms: ``engine``, ``backoff`` (the one back-off
rule) and ``child`` (the long-lived child process of the solver and the warmer). The
rules between the rooms are stated in each package's docstring and checked by
``tests/test_layers.py``.

May import: :mod:`packing` (the model and solvers), :mod:`kube` (Kubernetes I/O) and
:mod:`serving` (listeners, TLS). Not :mod:`webhook`: the extender and the webhook stand
side by side; :mod:`gpupack` wires them into one process when asked
(``gpupack serve --webhook-port``).
"""
