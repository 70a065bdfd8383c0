"""Exact, fast replay of the FGD paper's openb experiment (arrival-only GPU packing)."""
