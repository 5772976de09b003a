"""The Linux kernel, standard library only: rtnetlink for links, addresses and routes (netlink),
network namespaces (netns), TX checksum offload (ethtool) and a Pod's gratuitous ARP / NA
(announce). Imports only cni.lean."""
