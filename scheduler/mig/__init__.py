"""The MIG actuator (``gpupack serve --mig-actuator``, docs/mig.md): MIG layouts asked of
the GPU Operator's MIG manager for the pods that wait, and, under ``compact``, MIG
compaction (``--mig-compact``), run in the actuator's step.

``decide`` is the actuator's pure decision, ``changes`` the changes in flight and the
node back-offs (values, and the JSON a new leader reads back), ``loop`` its handler,
``views`` its view of the cache's nodes, ``holds`` the cache holds both the actuator and
compaction keep, ``metrics`` the actuator's figures. The layout planning is
:mod:`packing.mig`; the ConfigMap, label and compaction memory I/O :mod:`kube.mig`.

May import, of :mod:`scheduler`: the shared helpers only (``backoff``). Nothing of
:mod:`scheduler` imports it but the command layer (:mod:`gpupack`).
"""
