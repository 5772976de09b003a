"""Ferry's IPAM (the ``ferry-ipam`` executable, also called in-process by the plugin): ranges from
the config and the node state (ranges), the allocator over a file-per-address store that survives
crashes (allocator, store), the library API and the CNI plugin (api, plugin). Standard library only:
it runs once per Pod. A layer of the plugin: imports only cni.spec, cni.node and cni.lean below it,
and only cni.commands imports it within cni/ (docs/design/contracts.md, "Module map")."""
