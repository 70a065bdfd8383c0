"""What defragmentation (and MIG compaction) read to know what may be evicted: ``inputs``
(pod owners, the pods file's budgets) and ``pdb`` (PodDisruptionBudgets).
"""
