"""The background planner: a plan for every pending pod of our scheduler.

``loop`` is the planner's thread (debounced re-plans, the published plan and scorer);
``solve`` the solver process it hands each plan to.

May import, of :mod:`scheduler`: the shared helpers (``child``, ``backoff``) and, for
now, :mod:`scheduler.extender` (the scoring helpers of its verbs).
"""
