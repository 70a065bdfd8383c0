"""Defragmentation (``gpupack serve --defrag=plan|act``, docs/defrag.md): the fewest
evictions that let a waiting LLM group in, carried out one campaign at a time.

``decide`` is the pure decision, ``loop`` the handler. The plan itself is
:mod:`packing.defrag`; the budgets and owners it reads :mod:`kube.defrag`.

May import, of :mod:`scheduler`: :mod:`scheduler.groups` (the reservation book it hands
the freed room to) and the shared helpers. Nothing of :mod:`scheduler` imports it but
the command layer (:mod:`gpupack`).
"""
