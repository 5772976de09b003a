"""route-sync, the long-lived companion per Node: Node sources (sources), the mode's plan as plain
data (planner, peerflows, model), the appliers that diff it against OVS, netlink and nftables
(apply), BGP through ExaBGP (bgp), the loop (daemon), metrics, health and ``show``. Uses the
maintained libraries (ovsdbapp, kubernetes, prometheus-client) and, for netlink, cni.kernel's
client (pyroute2 measured too slow for its budget: bench/bench_netlink.py); imports from cni only
what cni's layers export publicly (pipeline, ovs, kernel, node, lean)."""
