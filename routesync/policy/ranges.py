"""Address blocks and port ranges as what OpenFlow matches: prefixes and value/mask pairs.

* ``ipBlock`` with ``except``: the block minus the exceptions, as the fewest prefixes
  (``ipaddress.address_exclude``); every prefix is one flow.
* ``port`` .. ``endPort``: the fewest ``tp_dst=value/mask`` pairs that cover the range exactly
  (at most 2 x 16 - 2 for 16-bit ports), the split ovs-ofctl documents for port ranges."""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def block_minus(cidr: str, excepts: list[str]) -> list[Network]:
    """``cidr`` without each of ``excepts`` (those outside it, or of the other family, are
    ignored, as Kubernetes does), sorted; ValueError for a malformed CIDR."""
    net = ipaddress.ip_network(cidr, strict=False)
    parts: list[Network] = [net]
    for e in excepts:
        ex = ipaddress.ip_network(e, strict=False)
        if ex.version != net.version:
            continue
        out: list[Network] = []
        for p in parts:
            if ex.version == p.version and p.subnet_of(ex):  # type: ignore[arg-type]
                continue  # wholly excepted
            if ex.version == p.version and ex.subnet_of(p):  # type: ignore[arg-type]
                out.extend(p.address_exclude(ex))  # type: ignore[arg-type]
            else:
                out.append(p)
        parts = out
    return sorted(parts, key=lambda n: (int(n.network_address), n.prefixlen))


def port_masks(first: int, last: int, bits: int = 16) -> list[tuple[int, int]]:
    """``(value, mask)`` pairs whose union is exactly ``first..last``."""
    if not 0 <= first <= last < 1 << bits:
        raise ValueError(f"port range {first}-{last} out of range")
    full = (1 << bits) - 1
    out: list[tuple[int, int]] = []
    lo = first
    while lo <= last:
        size = lo & -lo if lo else 1 << bits  # the largest aligned block starting at lo
        while lo + size - 1 > last:
            size >>= 1
        out.append((lo, full & ~(size - 1)))
        lo += size
    return out
