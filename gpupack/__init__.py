"""The command layer: the ``gpupack`` commands (:mod:`gpupack.cli`), each of which parses
its options, builds the parts and wires them (``serve``: :mod:`gpupack.serve_cmd` and
:mod:`gpupack.extender_app`; ``webhook``: :mod:`gpupack.webhook_cmd` over the one
snapshot feed of :mod:`gpupack.webhook_host`). The only package that constructs and
starts the background loops.

May import: every package of the project.
"""
