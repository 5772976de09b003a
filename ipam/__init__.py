"""Ferry's IPAM (the ``ferry-ipam`` executable, also called in-process by the plugin): ranges from
the config and the node state (ranges), the allocator over a file-per-address store that survives
crashes (allocator, store), the library API and the CNI plugin (api, plugin). Standard library only:
it runs once per Pod. Imports cni.spec, cni.node and cni.lean."""
