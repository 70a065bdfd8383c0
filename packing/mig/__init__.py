"""MIG in the pure model: ``layout`` (valid layouts of a GPU geometry, free placements,
maximal layouts) and ``plan`` (which idle GPUs of opted-in nodes get which new layout,
the pure core of the MIG actuator). The geometry tables are :mod:`packing.catalog`.
"""
