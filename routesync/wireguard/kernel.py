"""The kernel's WireGuard devices over rtnetlink: does the kernel have WireGuard, create a device,
delete it.  Which implementation a Node uses is decided elsewhere (:mod:`.device`); this only
asks the kernel.

A WireGuard link is an RTM_NEWLINK of kind ``wireguard`` with no IFLA_INFO_DATA (its keys and
peers come later: ``wg``, :mod:`.wgtool`).  Whether the kernel has it is the kernel's own answer
to creating one: a probe link, deleted at once when it was made; EOPNOTSUPP ("Unknown device
type") when the kernel has no such kind and cannot load a module for it.  Every call acts in the
current network namespace (route-sync runs inside the Node's, ``ip netns exec``) or in
``netns``: a name under /run/netns or a path."""

from __future__ import annotations

import errno
import secrets

from cni.kernel.netlink import Netlink, NetlinkError
from cni.pipeline.tables import MAX_IFNAME

KIND = "wireguard"  # the kernel's link kind (drivers/net/wireguard: rtnl_link_ops.kind)
PROBE_PREFIX = "ferry-wgp"  # + 6 hex digits: the probe link's name, gone after the probe


def _netlink(netns: str | None) -> Netlink:
    if netns is None:
        return Netlink()
    return Netlink.in_netns(netns if "/" in netns else f"/run/netns/{netns}")


def _check_name(name: str) -> str:
    if not name or len(name.encode()) > MAX_IFNAME or "/" in name or any(c.isspace() for c in name):
        raise ValueError(f"WireGuard link name: not a valid interface name: {name!r}")
    return name


def kernel_supported(netns: str | None = None) -> bool:
    """True when the kernel creates WireGuard links (built in, loaded, or a module it loads on
    demand); False when it answers EOPNOTSUPP.  Any other answer (EPERM without CAP_NET_ADMIN,
    ...) raises :class:`NetlinkError`: not knowing is not "no"."""
    with _netlink(netns) as nl:
        for _attempt in range(3):
            probe = f"{PROBE_PREFIX}{secrets.token_hex(3)}"
            try:
                nl.link_add(probe, KIND)
            except NetlinkError as e:
                if e.errno == errno.EOPNOTSUPP:
                    return False
                if e.errno == errno.EEXIST:  # the name is someone's: another one
                    continue
                raise
            nl.link_del(probe)
            return True
    raise NetlinkError(errno.EEXIST, f"probe for WireGuard links: three probe names were taken ({PROBE_PREFIX}*)")


def create_link(name: str, netns: str | None = None) -> bool:
    """Create WireGuard link ``name`` (down, no keys); False when a WireGuard link of that name is
    there already.  A link of another kind by that name: NetlinkError EEXIST naming its kind; no
    WireGuard in the kernel: NetlinkError EOPNOTSUPP."""
    _check_name(name)
    with _netlink(netns) as nl:
        try:
            nl.link_add(name, KIND)
        except NetlinkError as e:
            if e.errno != errno.EEXIST:
                raise
            link = nl.link_get(name)
            if link is not None and link.kind == KIND:
                return False
            raise NetlinkError(errno.EEXIST, f"create WireGuard link {name}: the name is taken by a "
                                             f"{link.kind if link else 'vanished'} link") from None
        return True


TUN_KIND = "tun"  # a userspace implementation's device (wireguard-go exits when it goes)


def delete_link(name: str, netns: str | None = None, kind: str = KIND) -> bool:
    """Delete WireGuard link ``name`` (``kind``: the kernel's, or :data:`TUN_KIND` for a userspace
    device); False when there is none.  A link of another kind is not touched: ValueError naming
    its kind."""
    _check_name(name)
    with _netlink(netns) as nl:
        link = nl.link_get(name)
        if link is None:
            return False
        if link.kind != kind:
            raise ValueError(f"delete WireGuard link {name}: it is a {link.kind or 'kind-less'} link, not deleted")
        return nl.link_del(link.index)
