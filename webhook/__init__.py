"""The mutating admission webhook: sizing GPU pods and naming their scheduler.

May import: :mod:`packing` (the model), :mod:`kube` (object annotations) and
:mod:`serving` (listeners, TLS, metrics). Not :mod:`scheduler`: the webhook and the
extender stand side by side; :mod:`gpupack` wires either one's cluster view in.
"""
