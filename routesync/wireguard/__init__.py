"""WireGuard between Nodes (``trafficEncryptionMode: wireguard``).

* :mod:`.model` the plain data: a device's desired peers, the change that gets it there, what a
  device reports back; the backend protocol the appliers use
* :mod:`.keys` the Node's private key files (0600) and public keys
* :mod:`.plan` pure: Node records + this Node's keys → the device's peers, what to publish, who is
  refused and why; the key rotation's schedule
* :mod:`.uapi` the userspace implementation's configuration socket (wireguard-go)
* :mod:`.wgtool` the ``wg`` command lines (the kernel's WireGuard)
* :mod:`.device` which implementation a Node uses, the device's life (created, restarted) and its sync
"""
