"""NetworkPolicy (``networking.k8s.io/v1``) in OVS: the API objects as plain data
(:mod:`.model`), label selectors (:mod:`.selector`), address and port ranges as OpenFlow masks
(:mod:`.ranges`), the flows of one Node (:mod:`.plan`, pure) and the Kubernetes watches that feed
it (:mod:`.watch`).  The pipeline's tables are declared in :mod:`cni.pipeline.tables`."""
