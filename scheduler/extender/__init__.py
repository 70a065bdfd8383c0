"""The HTTP extender: kube-scheduler's filter, prioritize, bind and preempt calls.

``wire`` decodes and encodes the extender protocol, ``points`` runs each extension point
on the cache (under its lock), ``verbs`` holds the pure answers, ``app`` is the Flask
adapter; ``view_lag``, ``request_pods`` and ``refusals`` keep what the points remember
between calls; ``metrics`` and ``metrics_http`` export the figures.

May import, of :mod:`scheduler`: :mod:`scheduler.memo`, :mod:`scheduler.planner` (the
latest plan), :mod:`scheduler.groups` (the group members' answers) and the shared
helpers (``child``, ``backoff``). Never :mod:`scheduler.mig` nor
:mod:`scheduler.defrag`: the verbs see what those do only as holds in the cache.
"""
