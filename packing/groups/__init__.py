"""LLM groups in the pure model: ``members`` (reservation members of pods not created
yet, group labels), ``placement`` (which domain and GPUs each member gets, and which
pods to evict for a whole group) and ``solver`` (its CP-SAT model).
"""
