"""The HTTP extender: kube-scheduler's filter, prioritize, bind and preempt calls.

``wire`` decodes and encodes the extender protocol; ``cycle`` is one request's state (the
pod read once) and the protocol of a participant (a plugin at the extension points);
``points`` runs each extension point on the cache (under its lock): its participants
first, then the default verbs; ``verbs`` holds the pure answers; ``app`` is the Flask
adapter; ``view_lag``, ``request_pods`` and ``refusals`` keep what the points remember
between calls; ``metrics`` and ``metrics_http`` export the figures.

May import, of :mod:`scheduler`: :mod:`scheduler.memo` (the per-node answers),
:mod:`scheduler.planner` (the latest plan) and the shared helpers. Never
:mod:`scheduler.groups`, :mod:`scheduler.mig` nor :mod:`scheduler.defrag`: the groups
take part through the participants the command layer hands in
(:mod:`gpupack.extender_app`), and the verbs see what the MIG actuator and
defragmentation do only as holds in the cache.
"""
