"""The verbs' memo: what a pod shape gets on a node state (fits or why not, the scorer's
best option), computed once per (shape, node signature).

``decide`` holds the pure per-node evaluation, the memo, and the scoring helpers the
extender's verbs, the warmer and the planner share; ``loop`` is the warmer, which fills
the memo for pending shapes before a request asks (in a child process by default).

May import, of :mod:`scheduler`: the shared helpers (``child``, ``backoff``) only. The
extender and the planner import it; it imports neither.
"""
