"""The verbs' memo: what a pod shape gets on a node state (fits or why not, the scorer's
best option), computed once per (shape, node signature), and the warmer (``loop``) that
fills it for pending shapes before a request asks.

May import, of :mod:`scheduler`: the shared helpers (``child``, ``backoff``) and, for
now, :mod:`scheduler.extender` and :mod:`scheduler.planner`.
"""
