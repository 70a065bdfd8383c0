"""LLM groups' Kubernetes I/O: ``reservations`` (the reservation records, one ConfigMap
per group, and their writer), ``inputs`` (ResourceQuotas and LeaderWorkerSets kept
parsed for the book) and ``lws`` (LeaderWorkerSet objects).
"""
