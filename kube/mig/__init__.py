"""The MIG actuator's Kubernetes I/O: ``api`` (the mig-parted ConfigMap, the Node label,
Events) and ``compaction_memory`` (compaction's budget and cool-downs across leaders).
"""
