"""What a Node holds for the plugin: the validated plugin config merged with the node state
(config), the state file route-sync writes (nodestate), the attachment locks both take (locks)
and atomic file replacement (atomicfile). Imports cni.spec, cni.pipeline and cni.lean."""
