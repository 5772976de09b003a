"""Ferry's OpenFlow pipeline as data, shared with route-sync: tables, cookies, port names and
external_ids keys (tables), traffic modes, peer paths, datapaths and tunnel types (modes), a
flow's match fields and actions as typed values (match, actions), the base and per-Pod flow
planners (flows, chained), the Services' conntrack flows (services), and a Pod's interface MTU
and routes per path (podnet). Pure functions; imports only cni.lean."""
