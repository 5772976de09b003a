"""One OpenFlow layer for the plugin and route-sync: codec (flow-mods from typed flows, barriers,
bundles, echo, framing and errors), session (a connection: one-shot transactions, atomic bundles),
ofctl (ovs-ofctl, for dumps only), bridge (a bridge's flow table as the plugin uses it)."""
