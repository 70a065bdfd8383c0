"""The pure model: nodes, GPUs, pods and placements as small frozen values, the working
state the solvers share (:mod:`packing.state`), the policies and CP-SAT models, and the
one validator every answer passes (:mod:`packing.validate`). Each feature's pure model
has its own package: :mod:`packing.groups`, :mod:`packing.mig`, :mod:`packing.defrag`.

May import: nothing of the project. No I/O, no clock: every input is an argument.
"""
