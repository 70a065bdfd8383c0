"""Research room: trace replay and the FGD paper's published protocol, apart from the product.

``sim.traces`` reads Alibaba's openb trace files; ``sim.openb`` replays them (arrival-only
fill to 130% of GPU capacity, the paper's seeds), with FGD and the baselines as the paper
defines them and gpupack's shipped placement score through a thin adapter
(``sim.openb.policies.ProductPolicy`` over :func:`packing.policies.lookahead.best_on_nodes`,
the function the extender's scorer calls), plus the offline CP-SAT bound.

Layering: ``sim`` imports ``packing`` only; the servers (``scheduler``, ``webhook``,
``nodeagent``) never import ``sim``; the CLI (``gpupack simulate --trace openb``) and the
benchmarks do.
"""
