"""The background planner: a plan for every pending pod of our scheduler.

``decide`` holds its pure choices (the candidate nodes of a batch, a node's capacity for
a shape, why a pod fits no class of nodes), ``loop`` the planner's thread (debounced
re-plans, the published plan and scorer), ``solve`` the solver process it hands each
plan to.

May import, of :mod:`scheduler`: :mod:`scheduler.memo` (the scoring helpers) and the
shared helpers (``child``, ``backoff``). Never the extender, whose verbs read the plan.
"""
