"""Open vSwitch clients for the per-Pod path: OVSDB JSON-RPC on the unix socket (ovsdb), and
OpenFlow (openflow/: the codec of typed flows to OpenFlow 1.3 bytes, sessions on the bridge's
management socket, ovs-ofctl for dumps).  Imports cni.pipeline (the flows it sends) and cni.lean."""
