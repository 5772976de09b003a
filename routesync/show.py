"""``ferry-route-sync show``: the per-peer decisions from the node state file, as a table or JSON, and
the Pod CIDR conflicts the daemon last wrote (``routesync.conflicts``)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from cni.lean.record import as_dict as asdict
from cni.node.nodestate import NodeState
from cni.pipeline.modes import PATH_TUNNEL, PATH_WIREGUARD, via

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .bgp.status import BgpStatus
    from .model import CidrConflict

COLUMNS = ("PEER", "TRANSPORT", "POD CIDRS", "PATH", "MTU", "NEXT-HOP MAC", "MAC SOURCE", "VIA")


def path_mtu(state: NodeState, path: str) -> int:
    """The MTU a Pod's packets get on ``path``: the tunnel MTU through a tunnel, the full
    (transport) MTU on every unencapsulated path (``cni/pipeline/podnet.py``)."""
    return state.mtu if path in (PATH_TUNNEL, PATH_WIREGUARD) else (state.transportMTU or state.mtu)


def rows(state: NodeState) -> list[dict[str, Any]]:
    return [{
        "peer": p.name,
        "transport": ",".join(p.addresses) or None,
        "podCIDRs": list(p.podCIDRs),
        "path": p.path,
        "via": via(p.path),
        "mtu": path_mtu(state, p.path),
        "nextHopMAC": p.mac,
        "macSource": p.macSource,
    } for p in sorted(state.peers, key=lambda p: (p.name, p.podCIDRs))]


def mtus(state: NodeState) -> str:
    """``mtu 1500 (Pods, routed, non-Pod), 1450 tunnelled``; one number when there is one MTU."""
    full = state.transportMTU or state.mtu
    if full == state.mtu:
        return f"mtu {full}"
    return f"mtu {full} (Pods, routed, non-Pod), {state.mtu} tunnelled"


def uplink_record(state_file: str) -> dict[str, Any] | None:
    """The uplink move's record beside the state file (``routesync.apply.uplink``: name, the
    physical link's name, bridge, phase, transport VLAN), None when the uplink is not moved."""
    import os

    try:
        with open(os.path.join(os.path.dirname(state_file) or ".", "uplink.json")) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    return {k: raw.get(k) for k in ("name", "renamed", "bridge", "phase", "vlan")}


def uplink_line(uplink: dict[str, Any] | None) -> str:
    if uplink is None:
        return "uplink not on the bridge, untagged"
    vlan = f"transport VLAN {uplink['vlan']}" if uplink.get("vlan") else "untagged"
    return (f"uplink {uplink['name']} on {uplink['bridge']} (physical {uplink['renamed']}, {uplink['phase']}), "
            f"{vlan}")


def as_json(state: NodeState, bgp: BgpStatus | None = None, conflicts: Sequence[CidrConflict] = (),
            uplink: dict[str, Any] | None = None, wireguard: dict[str, Any] | None = None) -> str:
    from .bgp import status as bgp_status

    return json.dumps({"node": state.node, "mode": state.mode, "mtu": state.mtu, "uplink": uplink,
                       "encryption": state.encryption, "wireguard": wireguard,
                       "transportMTU": state.transportMTU or state.mtu,
                       "podCIDRs": state.podCIDRs, "gateway": asdict(state.gateway),
                       "tunnel": asdict(state.tunnel) if state.tunnel else None,
                       "peers": rows(state),
                       "podCIDRConflicts": [{"node": c.node, "cidr": c.cidr, "owner": c.owner,
                                             "ownerCIDR": c.owner_cidr} for c in conflicts],
                       "bgp": bgp_status.to_dict(bgp) if bgp is not None else None}, indent=2)


def as_table(state: NodeState, bgp: BgpStatus | None = None, conflicts: Sequence[CidrConflict] = (),
             uplink: dict[str, Any] | None = None, wireguard: dict[str, Any] | None = None) -> str:
    tunnel = f"{state.tunnel.type} ({state.tunnel.port}, ofport {state.tunnel.ofport})" if state.tunnel else "none"
    head = (f"node {state.node}  mode {state.mode}  {mtus(state)}  pod CIDRs {', '.join(state.podCIDRs)}\n"
            f"gateway {state.gateway.name} {state.gateway.mac} {', '.join(state.gateway.addresses) or '-'}"
            f"  tunnel {tunnel}\n{uplink_line(uplink)}\n")
    cells = [COLUMNS] + [(r["peer"], r["transport"] or "-", ",".join(r["podCIDRs"]), r["path"], str(r["mtu"]),
                          r["nextHopMAC"] or "-", r["macSource"] or "-", r["via"]) for r in rows(state)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if len(cells) == 1:
        lines.append("(no peers)")
    out = head + "\n".join(lines) + "\n"
    if conflicts:
        from .conflicts import describe

        out += (f"\nPod CIDR conflicts ({len(conflicts)}):\n"
                + "".join(f"  {describe(c, state.node)}\n" for c in conflicts))
    if wireguard is not None:
        from .wireguard import status as wg_status

        out += "\n" + wg_status.as_table(wireguard, time.time())
    if bgp is not None:
        from .bgp import status as bgp_status

        out += "\n" + bgp_status.as_table(bgp, time.time())
    return out
