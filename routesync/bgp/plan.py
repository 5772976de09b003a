"""The BGP speaker's plan, pure: which routes this Node advertises, ExaBGP's configuration and
environment, the API commands from one set of routes to the next, and ExaBGP's JSON events read
back into plain data.  ``routesync.bgp.speaker`` runs ExaBGP with what this module renders.

    routes = plan.routes(cfg.bgp, me.pod_cidrs, facts.uplink_addresses)      # frozenset[Route]
    text = plan.render_exabgp(cfg.bgp, plan.sessions(cfg.bgp, facts.uplink_addresses), relay_argv)
    lines = plan.commands(sent, routes)          # "announce route ..." / "withdraw route ..."
    event = plan.parse_event(line)               # PeerEvent | Answer | None

One session per peer carries both families (MP-BGP, RFC 4760): an IPv6 Pod CIDR is announced
with the Node's IPv6 transport address as next hop over an IPv4 session and the other way round."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass

from ..config import BgpConfig, BgpPeer

# NOTIFICATION (code, subcode) -> what an operator reads in the log and the metric's reason label
# (RFC 4271 section 4.5, RFC 4486 for Cease).
NOTIFICATIONS: dict[tuple[int, int], tuple[str, str]] = {
    (2, 2): ("bad-peer-as", ("OPEN message error: bad peer AS (bgp.localASN is not what the peer expects, "
                             "or bgp.peers[].asn is not the peer's)")),
    (2, 3): ("bad-bgp-identifier", "OPEN message error: bad BGP identifier (bgp.routerID)"),
    (2, 4): ("unsupported-parameter", "OPEN message error: unsupported optional parameter"),
    (2, 6): ("unacceptable-hold-time", "OPEN message error: unacceptable hold time (bgp.peers[].holdTime)"),
    (2, 7): ("unsupported-capability", "OPEN message error: unsupported capability"),
    (4, 0): ("hold-timer-expired", "hold timer expired"),
    (6, 2): ("administrative-shutdown", "cease: administrative shutdown"),
    (6, 3): ("peer-deconfigured", "cease: peer de-configured"),
    (6, 4): ("administrative-reset", "cease: administrative reset"),
    (6, 5): ("connection-rejected", "cease: connection rejected (the peer does not accept this Node)"),
    (6, 7): ("connection-collision", "cease: connection collision resolution"),
}
NOTIFICATION_CODES = {1: "message header error", 2: "OPEN message error", 3: "UPDATE message error",
                      4: "hold timer expired", 5: "finite state machine error", 6: "cease"}
# reason labels besides the NOTIFICATION ones
REASON_CONNECT = "connect-failed"  # the TCP session did not come up (peer down, refused, unreachable)
REASON_CLOSED = "connection-closed"  # an established session ended without a NOTIFICATION


@dataclass(frozen=True, order=True)
class Route:
    prefix: str  # "10.244.1.0/24"
    next_hop: str  # the Node's transport address of the prefix's family

    @property
    def family(self) -> int:
        return 6 if ":" in self.prefix else 4


@dataclass(frozen=True)
class Session:
    """One neighbour as ExaBGP is configured for it."""

    peer: BgpPeer
    local_address: str  # the Node's transport address of the peer's family
    router_id: str


@dataclass(frozen=True)
class PeerEvent:
    """A state change ExaBGP reported for one neighbour."""

    peer: str
    state: str  # "connected" | "up" | "down"
    reason: str = ""  # ExaBGP's words, for "down"


@dataclass(frozen=True)
class Answer:
    """ExaBGP's acknowledgement of one API command (``exabgp.api.ack``)."""

    ok: bool
    text: str


class PlanError(ValueError):
    """The Node lacks what the ``bgp`` section needs (names the key)."""


def _addresses(uplink_addresses: tuple[str, ...]) -> dict[int, str]:
    """The first transport address of each family (host part only)."""
    out: dict[int, str] = {}
    for a in uplink_addresses:
        ip = ipaddress.ip_interface(a).ip
        if ip.is_link_local:
            continue
        out.setdefault(ip.version, str(ip))
    return out


def router_id(bgp: BgpConfig, uplink_addresses: tuple[str, ...]) -> str:
    """``bgp.routerID``, else the Node's transport IPv4 address."""
    if bgp.router_id:
        return bgp.router_id
    v4 = _addresses(uplink_addresses).get(4)
    if v4 is None:
        raise PlanError("config key 'bgp.routerID': the Node has no IPv4 transport address to take it from; "
                        "set one (any unique IPv4 address)")
    return v4


def sessions(bgp: BgpConfig, uplink_addresses: tuple[str, ...]) -> tuple[tuple[Session, ...], list[str]]:
    """The sessions to configure and, for peers this Node cannot reach, why (log lines)."""
    rid = router_id(bgp, uplink_addresses)
    mine = _addresses(uplink_addresses)
    out, problems = [], []
    for i, p in enumerate(bgp.peers):
        fam = ipaddress.ip_address(p.address).version
        local = mine.get(fam)
        if local is None:
            problems.append(f"config key 'bgp.peers[{i}].address': {p.address} is IPv{fam} and the Node has no "
                            f"IPv{fam} transport address; no session")
            continue
        out.append(Session(p, local, rid))
    return tuple(out), problems


def routes(bgp: BgpConfig, pod_cidrs: tuple[str, ...], uplink_addresses: tuple[str, ...]
           ) -> tuple[frozenset[Route], list[str]]:
    """What to advertise (``bgp.prefixes``, else the Node's Pod CIDRs), each with the Node's
    transport address of its family as next hop; and the prefixes left out, with why."""
    mine = _addresses(uplink_addresses)
    out, problems = set(), []
    for prefix in (bgp.prefixes if bgp.prefixes is not None else pod_cidrs):
        net = ipaddress.ip_network(prefix, strict=False)
        hop = mine.get(net.version)
        if hop is None:
            problems.append(f"{net} not advertised: the Node has no IPv{net.version} transport address for a next hop")
            continue
        out.add(Route(str(net), hop))
    return frozenset(out), problems


def _route_line(r: Route) -> str:
    return f"route {r.prefix} next-hop {r.next_hop}"


def commands(sent: frozenset[Route], wanted: frozenset[Route]) -> list[str]:
    """API lines taking ExaBGP's announced routes from ``sent`` to ``wanted``: withdrawals first
    (a prefix whose next hop changed is withdrawn, then announced again)."""
    return ([f"withdraw {_route_line(r)}" for r in sorted(sent - wanted)]
            + [f"announce {_route_line(r)}" for r in sorted(wanted - sent)])


def render_exabgp(bgp: BgpConfig, sess: tuple[Session, ...], relay: list[str], process: str = "ferry") -> str:
    """ExaBGP's configuration: the API process (``relay``: route-sync's relay between ExaBGP's
    pipes and route-sync's socket) and one neighbour per session, both families on each."""
    lines = [f"process {process} {{",
             f"    run {' '.join(relay)};",  # ExaBGP splits on spaces: no quoting
             "    encoder json;",
             "}", ""]
    for s in sess:
        p = s.peer
        lines += [f"neighbor {p.address} {{",
                  f"    router-id {s.router_id};",
                  f"    local-address {s.local_address};",
                  f"    local-as {bgp.local_asn};",
                  f"    peer-as {p.asn};",
                  f"    hold-time {p.hold_time};"]
        if p.password:
            lines.append(f'    md5-password "{p.password}";')
        lines += ["    family {", "        ipv4 unicast;", "        ipv6 unicast;", "    }"]
        if bgp.graceful_restart:
            lines += ["    capability {", f"        graceful-restart {bgp.graceful_restart};", "    }"]
        lines += ["    api {", f"        processes [ {process} ];", "        neighbor-changes;",
                  "        receive { notification; }", "    }", "}", ""]
    return "\n".join(lines)


def exabgp_env() -> dict[str, str]:
    """ExaBGP's settings (its environment variables): in the foreground as route-sync's child,
    root kept (it binds to the Node's address and signs with TCP MD5), no listening socket (the
    Node opens every session), no CLI pipes (route-sync is the only client), an acknowledgement
    per command, and ExaBGP ends when its API process does (route-sync restarts it)."""
    return {
        "exabgp.daemon.daemonize": "false",
        "exabgp.daemon.user": "root",
        "exabgp.daemon.drop": "false",
        "exabgp.daemon.pid": "",
        "exabgp.tcp.bind": "",
        "exabgp.api.cli": "false",
        "exabgp.api.ack": "true",
        "exabgp.api.respawn": "false",
        "exabgp.api.terminate": "true",
        "exabgp.log.destination": "stdout",  # route-sync points ExaBGP's stdout at its log file
        "exabgp.log.short": "false",
    }


def parse_event(line: str) -> PeerEvent | Answer | None:
    """One line from ExaBGP's API: a neighbour state change, an acknowledgement, or None (other
    messages; a NOTIFICATION also ends the session, whose "down" event carries its codes)."""
    line = line.strip()
    if line in ("done", "error"):
        return Answer(line == "done", line)
    if not line.startswith("{"):
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict) or msg.get("type") != "state":
        return None
    n = msg.get("neighbor") or {}
    peer = ((n.get("address") or {}).get("peer")) if isinstance(n, dict) else None
    state = n.get("state") if isinstance(n, dict) else None
    if not isinstance(peer, str) or not isinstance(state, str):
        return None
    return PeerEvent(peer, state, str(n.get("reason") or ""))


def classify(reason: str, was_up: bool) -> tuple[str, str]:
    """ExaBGP's reason for a session going down -> (metric reason label, what to log)."""
    import re

    m = re.search(r"notification (?:received|sent) \((\d+),(\d+)\)", reason)
    if m:
        code, sub = int(m.group(1)), int(m.group(2))
        label, text = NOTIFICATIONS.get((code, sub), NOTIFICATIONS.get((code, 0), ("", "")))
        if not label:
            label = f"notification-{code}-{sub}"
            text = f"{NOTIFICATION_CODES.get(code, 'notification')} (code {code}, subcode {sub})"
        side = "from the peer" if "received" in reason else "sent to the peer"
        return label, f"{text}; NOTIFICATION {side}"
    if not was_up:
        return REASON_CONNECT, f"no session ({reason or 'connection failed'}: peer down, refusing, or unreachable)"
    return REASON_CLOSED, f"session closed ({reason or 'no reason given'})"
