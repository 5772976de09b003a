"""ferry-lab: a multi-Node cluster on one machine (Nodes as network namespaces, each with its own
OVS), from a topology file to a running lab, on the embedded registry or a real Kubernetes cluster."""
