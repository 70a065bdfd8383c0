"""LLM groups' Kubernetes I/O: ``reservations`` (the reservation records, one ConfigMap
per group, and their writer), ``inputs`` (ResourceQuotas, LeaderWorkerSets, PodGroups
and Workloads kept parsed for the book), ``lws`` (LeaderWorkerSet objects) and
``workload_api`` (kube-scheduler's PodGroups and Workloads, and a pod's
``spec.schedulingGroup``).
"""
