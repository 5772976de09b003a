"""ClusterNetworkPolicy (``policy.networking.k8s.io/v1beta1``): the administrator's tiers around
NetworkPolicy, Admin before it and Baseline after it (:mod:`.model`, :mod:`.plan`)."""
