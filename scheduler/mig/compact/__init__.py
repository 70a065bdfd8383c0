"""MIG compaction: empty a MIG GPU whose few pods fit in free slices of GPUs in use.

``decide`` is the pure decision, ``loop`` the handler the MIG actuator's step calls.

May import, of :mod:`scheduler`: :mod:`scheduler.mig` (the actuator's node views and
holds) and the shared helpers.
"""
