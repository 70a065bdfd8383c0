"""Dynamic Resource Allocation: where GPUs are ResourceSlices, which device kube-scheduler's
allocator will pick.

The same discipline as :mod:`packing.device_plugin`: a model of another component's
choice, checked against the real component (the e2e differential test
``tests/e2e/test_e2e_dra_allocator.py`` runs hundreds of claims through kube-scheduler
v1.37.2 and compares every allocation).

* :mod:`packing.dra.objects`: the ``resource.k8s.io/v1`` objects as frozen values;
* :mod:`packing.dra.parse`: those values from the API's JSON, errors naming the field;
* :mod:`packing.dra.cel`: the CEL subset that selectors use, with "unknown" for the rest
  (its parser: :mod:`packing.dra.cel_syntax`);
* :mod:`packing.dra.pools`: which pools and devices a node reaches, in allocation order;
* :mod:`packing.dra.capacity`: consumable capacity (KEP-5075) arithmetic;
* :mod:`packing.dra.allocator`: the allocator itself (:func:`~packing.dra.allocator.predict`);
* :mod:`packing.dra.extended`: the claim kube-scheduler makes for DRA-backed extended
  resources (KEP-5004);
* :mod:`packing.dra.offers`: what a burst of one-device claims of a class gets on a
  node, claim after claim (what the webhook counts);
* :mod:`packing.dra.served`: the DeviceClasses gpupack's chart ships, serving the
  webhook's extended resources from the NVIDIA driver's devices;
* :mod:`packing.dra.world`: a cluster's DRA objects read once (bad ones reported),
  ready for predictions: what a cache hands the model;
* :mod:`packing.dra.nvidia`: ResourceSlices and DeviceClasses shaped as the NVIDIA DRA
  driver publishes them.

Layer: part of ``packing``; imports nothing of ours outside ``packing``. Pure: no I/O,
no clock.
"""
