"""ferry-controller: one watch of the whole cluster, and to each Node only the remote Pods its
policy plans read (issue 46, ``docs/design/peerslices.md``).  :mod:`.slices` plans the PeerSlice
objects that carry them (pure): which slices, their labels (what a Node's route-sync selects them
by), their entries, and the fewest writes that take the cluster's slices from one state to the
next."""
