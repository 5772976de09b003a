"""MTUs of a Node's paths: the transport (underlay) MTU, and the tunnel MTU = transport MTU
minus what the tunnel adds to every packet.

Pods' interfaces, the gateway port and every path that is not encapsulated (routed peers,
non-Pod destinations) carry the transport MTU; the routes to tunnelled Pod CIDRs (in the Pods,
``cni/pipeline/podnet.py``, and the Node's own host routes) the tunnel MTU.

Overheads count everything the encapsulation puts around the inner IP packet, over an IPv4
underlay: outer IPv4 header (20) + the tunnel's own headers + the inner Ethernet header (14).

* vxlan 50 = 20 + UDP 8 + VXLAN 8 + 14
* geneve 50 = 20 + UDP 8 + Geneve 8 (no options; Ferry sets none) + 14
* gre 42 = 20 + GRE 8 (with the key that ``key=flow`` adds) + 14 (OVS's GRE carries Ethernet)
* stt 72 = 20 + TCP 20 + STT 18 + 14 (the issue's draft said 54: that omits the TCP header)

An IPv6 underlay's header is 40 bytes instead of 20: +20.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cni.pipeline.modes import GENEVE, GRE, STT, TUNNELLED_MODES, VXLAN

if TYPE_CHECKING:
    from cni.pipeline.modes import Mode, TunnelType

TUNNEL_OVERHEAD: dict[TunnelType, int] = {VXLAN: 50, GENEVE: 50, GRE: 42, STT: 72}
IPV6_EXTRA = 20
MAX_MTU = 65000


def pod_mtu(transport_mtu: int, mode: Mode, tunnel_type: TunnelType, ipv6_underlay: bool = False,
            default_mtu: int = 0, encryption_overhead: int = 0) -> int:
    """The MTU of the paths to other Nodes' Pods (the "tunnel MTU").

    ``default_mtu`` > 0 overrides everything.  ``encryption_overhead`` > 0 (WireGuard carries
    every peer instead of the tunnel or the route: ``routesync.wireguard.plan.overhead``) is what
    is deducted, in every mode.  Otherwise the tunnel overhead is deducted in encap and hybrid
    (hybrid tunnels some peers; one MTU for all keeps a Pod's MTU independent of where its peer
    lives).  Capped at 65000 (loopback-like transports report 65536)."""
    if default_mtu > 0:
        return default_mtu
    mtu = transport_mtu
    if encryption_overhead > 0:
        mtu -= encryption_overhead
    elif mode in TUNNELLED_MODES:
        mtu -= TUNNEL_OVERHEAD[tunnel_type] + (IPV6_EXTRA if ipv6_underlay else 0)
    return max(min(mtu, MAX_MTU), 68)


def transport_mtu(transport: int, default_mtu: int = 0) -> int:
    """The full MTU: Pods' interfaces, the gateway port, unencapsulated paths.  ``default_mtu``
    > 0 (the operator's one MTU) overrides it too.  Capped like :func:`pod_mtu`."""
    if default_mtu > 0:
        return default_mtu
    return max(min(transport, MAX_MTU), 68)
