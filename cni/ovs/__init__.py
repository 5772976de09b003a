"""Open vSwitch clients for the per-Pod path: OVSDB JSON-RPC on the unix socket (ovsdb), OpenFlow
1.3 on the bridge's management socket (ofnative) and ovs-ofctl for dumps and bundles (ofctl).
Imports cni.pipeline (the flows it sends) and cni.lean."""
