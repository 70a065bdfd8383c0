"""Defragmentation in the pure model: ``plan`` (the fewest, cheapest evictions that let a
waiting group in), ``model`` (its CP-SAT selection) and ``landing`` (where the evicted
pods land).
"""
