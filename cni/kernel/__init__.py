"""The Linux kernel, standard library only: rtnetlink for links, addresses, routes and neighbours
(netlink: the plugin's and route-sync's one netlink stack; neighbours: route-sync's neighbour
table and events on it), network namespaces (netns), TX checksum offload (ethtool) and a Pod's
gratuitous ARP / NA (announce). Imports only cni.lean."""
