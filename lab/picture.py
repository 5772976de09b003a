"""``ferry-lab show --svg FILE`` / ``--png FILE``: the lab drawn with Graphviz.

Nodes grouped by segment (each segment a box holding its Linux bridge and its Nodes, each Node
with its Pods), the router between the segments, the external host behind it, and one edge per
pair of Nodes styled by the path their state files name: a tunnel (dashed, one colour per
tunnel type), routed on the segment (solid), left to the underlay (dotted, the router routes
Pod CIDRs), the fast path (bold), WireGuard (bold teal: an encrypted lab), or no path of
Ferry's (networkPolicyOnly: the primary CNI routes).  Pairs whose families or directions take
different paths say so in the label.

:func:`scene` reads the lab (state files, Pod results); :func:`peer_edges` and :func:`graph`
are pure (a :class:`Scene` in, DOT source out), so the drawing is tested without root;
:func:`draw` runs Graphviz's ``dot`` (Debian's ``graphviz``) through the ``graphviz`` package."""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import graphviz

from cni.pipeline.modes import (
    ENCRYPTION_NONE,
    GENEVE,
    GRE,
    PATH_FAST,
    PATH_NONE,
    PATH_ROUTE,
    PATH_TUNNEL,
    PATH_UNDERLAY,
    PATH_WIREGUARD,
    STT,
    TUNNELLED_MODES,
    VXLAN,
)
from lab.topology import FAMILIES, Topology, external_address, families_of, router_address

if TYPE_CHECKING:
    from lab.api import Lab

FORMATS = ("svg", "png")
FONT = "Helvetica"
UNDERLAY_COLOR = "#9a9a9a"
TUNNEL_COLORS = {VXLAN: "#1f6fb4", GENEVE: "#7b3fa8", GRE: "#a0522d", STT: "#1f6fb4"}
# path → (colour, style, penwidth, label); tunnel's colour and label come from its type
PATH_STYLES: dict[str, tuple[str, str, str, str]] = {
    PATH_TUNNEL: ("", "dashed", "2.2", "tunnel"),
    PATH_ROUTE: ("#2a9d3a", "solid", "2.2", "routed (host route via the peer)"),
    PATH_UNDERLAY: ("#e07b00", "dotted", "2.4", "underlay (the router routes Pod CIDRs)"),
    PATH_FAST: ("#d62728", "bold", "3.2", "fast path (OVS → uplink)"),
    PATH_NONE: ("#666666", "dotted", "1.4", "primary CNI routes (networkPolicyOnly)"),
    PATH_WIREGUARD: ("#0b7a75", "bold", "3.0", "WireGuard (encrypted, UDP between the Nodes)"),
}


class PictureError(Exception):
    """The picture cannot be made (unknown format, Graphviz missing or failing)."""


@dataclass(frozen=True)
class NodeView:
    name: str
    segment: str
    addresses: tuple[str, ...]
    pod_cidrs: tuple[str, ...]
    pods: tuple[tuple[str, tuple[str, ...]], ...]  # (name, addresses)
    state: Mapping[str, Any] | None  # the Node's state file (None: lone Node)


@dataclass(frozen=True)
class Scene:
    lab: str
    topology: Topology
    nodes: tuple[NodeView, ...]


@dataclass(frozen=True)
class PeerEdge:
    """One pair of Nodes (``a`` < ``b``) and the paths between them: (from, family, path, tunnel type)."""

    a: str
    b: str
    legs: tuple[tuple[str, int, str, str | None], ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted({p for _, _, p, _ in self.legs}))

    @property
    def main(self) -> str:
        """The path that styles the edge: the fast path over routed over the rest."""
        order = (PATH_WIREGUARD, PATH_FAST, PATH_TUNNEL, PATH_ROUTE, PATH_UNDERLAY, PATH_NONE)
        return min(self.paths, key=order.index) if self.paths else PATH_NONE

    @property
    def tunnel(self) -> str | None:
        return next((t for _, _, p, t in self.legs if p == PATH_TUNNEL and t), None)

    def label(self) -> str:
        def name(path: str, tunnel: str | None) -> str:
            if path == PATH_TUNNEL:
                return f"{tunnel or 'tunnel'} tunnel"
            return {PATH_ROUTE: "routed", PATH_UNDERLAY: "underlay", PATH_FAST: "fast path",
                    PATH_NONE: "no Ferry path", PATH_WIREGUARD: "WireGuard"}[path]

        per = {(frm, fam): name(p, t) for frm, fam, p, t in self.legs}
        kinds = set(per.values())
        if len(kinds) == 1:
            return kinds.pop()
        fams = sorted({fam for _, fam in per})
        parts = []
        for fam in fams:  # the same both ways for this family, or one entry per direction
            both = {per[k] for k in per if k[1] == fam}
            if len(both) == 1:
                parts.append(f"IPv{fam} {both.pop()}")
            else:
                parts += [f"IPv{fam} {frm}→: {per[(frm, f)]}" for frm, f in sorted(per) if f == fam]
        return "\n".join(parts)


def peer_edges(states: Mapping[str, Mapping[str, Any] | None]) -> list[PeerEdge]:
    """One edge per pair of Nodes that name each other in their state files (pure)."""
    legs: dict[tuple[str, str], list[tuple[str, int, str, str | None]]] = {}
    for node, state in states.items():
        if not state:
            continue
        tunnel = (state.get("tunnel") or {}).get("type")
        for peer in state.get("peers") or []:
            other = str(peer["name"])
            key = (min(node, other), max(node, other))
            for fam in families_of(list(peer.get("podCIDRs") or [])):
                legs.setdefault(key, []).append((node, fam, str(peer["path"]), tunnel))
    return [PeerEdge(a, b, tuple(sorted(v))) for (a, b), v in sorted(legs.items())]


def scene(lab: Lab) -> Scene:
    """What the picture shows, read from the running lab."""
    views = []
    for n in lab.nodes:
        pods = tuple((p.name, tuple(ip.split("/")[0] for ip in p.ips)) for p in n.pods())
        views.append(NodeView(n.name, n.spec.segment, tuple(a for a in n.addresses if a), n.spec.pod_cidrs,
                              pods, n.state()))
    return Scene(lab.name, lab.topology, tuple(views))


def _id(*parts: str) -> str:
    return "_".join(p.replace("-", "_") for p in parts)


def _lines(*parts: str | None) -> str:
    return "\n".join(p for p in parts if p)


def _mode_line(topo: Topology) -> str:
    rs = topo.route_sync
    if rs is None:
        return "no route-sync (lone Nodes)" + (", router routes Pod CIDRs" if topo.route_pod_cidrs else "")
    bits = [rs.trafficEncapMode]
    if rs.trafficEncapMode in TUNNELLED_MODES:
        bits.append(rs.tunnelType)
    if rs.fastPath:
        bits.append("fast path")
    if topo.router_bgp:
        bits.append("router learns Pod CIDRs over BGP")
    if topo.encrypted:
        bits.append(f"encrypted ({topo.encryption}: every peer)")
    fams = " + ".join(f"IPv{f}" for f in topo.pod_families)
    return f"route-sync {', '.join(bits)}; Pods {fams}"


def graph(sc: Scene) -> graphviz.Graph:
    """The lab as a Graphviz graph (pure: builds DOT source, runs nothing)."""
    topo = sc.topology
    g = graphviz.Graph(sc.lab, engine="dot")
    g.attr(rankdir="TB", fontname=FONT, fontsize="16", labelloc="t", newrank="true", nodesep="0.35",
           ranksep="0.6", pad="0.3", label=f"ferry-lab {sc.lab}: {_mode_line(topo)}\n ", bgcolor="white")
    g.attr("node", fontname=FONT, fontsize="10")
    g.attr("edge", fontname=FONT, fontsize="9")

    ext4, ext6 = external_address(topo)
    g.node("external", _lines("external host", ext4, ext6), shape="box", style="rounded,filled",
           fillcolor="#f2f2f2")
    g.node("router", _lines("router", *(a for s in topo.segments for a in router_address(topo, s.name) if a)),
           shape="box", style="filled", fillcolor="#e8e8e8")
    g.edge("router", "external", color=UNDERLAY_COLOR, penwidth="1.5")
    with g.subgraph() as top:  # the external host beside the router, above the segments
        top.attr(rank="same")
        top.node("router")
        top.node("external")

    by_segment: dict[str, list[NodeView]] = {}
    for n in sc.nodes:
        by_segment.setdefault(n.segment, []).append(n)
    for seg in topo.segments:
        switch = _id("seg", seg.name)
        with g.subgraph(name=_id("cluster", "seg", seg.name)) as c:
            c.attr(label=f"segment {seg.name}", style="rounded", color=UNDERLAY_COLOR, fontsize="12",
                   labeljust="l", labelloc="b")
            c.node(switch, _lines(f"segment {seg.name} (bridge)", *(seg.cidr(f) for f in FAMILIES),
                                  f"MTU {seg.mtu}"),
                   shape="box", fontsize="9", style="filled", fillcolor="#e4e4e4", color=UNDERLAY_COLOR)
            for n in by_segment.get(seg.name, []):
                _node(c, n)
        g.edge("router", switch, color=UNDERLAY_COLOR, penwidth="1.5")
        for n in by_segment.get(seg.name, []):
            g.edge(switch, _id("node", n.name), color=UNDERLAY_COLOR, penwidth="1.5")

    edges = peer_edges({n.name: n.state for n in sc.nodes})
    for e in edges:
        color, style, width, _ = PATH_STYLES[e.main]
        if e.main == PATH_TUNNEL:
            color = TUNNEL_COLORS.get(e.tunnel or "", TUNNEL_COLORS[VXLAN])
        g.edge(_id("node", e.a), _id("node", e.b), label=e.label(), color=color, fontcolor=color, style=style,
               penwidth=width, constraint="false")
    _legend(g, edges)
    return g


def _node(c: graphviz.Graph, n: NodeView) -> None:
    state = n.state or {}
    full = (state or {}).get("transportMTU") or (state or {}).get("mtu")
    other = "WireGuard" if (state.get("encryption") or ENCRYPTION_NONE) != ENCRYPTION_NONE else "tunnelled"
    detail = (f"{state.get('mode')}, MTU {full}"
              + (f", {other} {state.get('mtu')}" if full != state.get("mtu") else "")
              if state else "lone Node (no route-sync)")
    with c.subgraph(name=_id("cluster", "node", n.name)) as nc:
        nc.attr(label="", style="rounded,filled", fillcolor="#f7fbff", color="#8fb3d9")
        nc.node(_id("node", n.name), _lines(n.name, *n.addresses, "Pods " + " ".join(n.pod_cidrs), detail),
                shape="box", style="filled", fillcolor="#d8e8f8", color="#4a7ab0", fontsize="10")
        for pod, ips in n.pods:
            pid = _id("pod", n.name, pod)
            nc.node(pid, _lines(pod, *ips), shape="ellipse", fontsize="8", style="filled", fillcolor="white")
            nc.edge(_id("node", n.name), pid, color="#8fb3d9")


LINE_GLYPHS = {"solid": "──────", "dashed": "╌╌╌╌╌╌", "dotted": "┈┈┈┈┈┈", "bold": "━━━━━━"}


def _legend(g: graphviz.Graph, edges: Sequence[PeerEdge]) -> None:
    """One box naming each path drawn, with a sample of its line (an HTML-like table)."""
    used = sorted({(e.main, e.tunnel if e.main == PATH_TUNNEL else "") for e in edges})
    if not used:
        return
    rows = []
    for path, tunnel in used:
        color, style, _, text = PATH_STYLES[path]
        if path == PATH_TUNNEL:
            color, text = TUNNEL_COLORS.get(tunnel, TUNNEL_COLORS[VXLAN]), f"{tunnel} tunnel"
        rows.append(f'<TR><TD ALIGN="LEFT"><FONT COLOR="{color}">{LINE_GLYPHS[style]}</FONT></TD>'
                    f'<TD ALIGN="LEFT"><FONT COLOR="{color}">{html.escape(text)}</FONT></TD></TR>')
    g.node("legend", f'<<TABLE BORDER="0" CELLSPACING="2"><TR><TD COLSPAN="2" ALIGN="LEFT">paths between '
                     f'Nodes</TD></TR>{"".join(rows)}</TABLE>>', shape="box", style="rounded", color="#cccccc",
           fontsize="9")
    with g.subgraph() as top:
        top.attr(rank="same")
        top.node("router")
        top.node("legend")


def render(sc: Scene, fmt: str) -> bytes:
    if fmt not in FORMATS:
        raise PictureError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    g = graph(sc)
    if fmt == "png":
        g.attr(dpi="110")
    try:
        return g.pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise PictureError("Graphviz's dot is not installed (Debian: apt-get install graphviz)") from None
    except graphviz.CalledProcessError as e:
        raise PictureError(f"dot failed: {e}") from None


def draw(lab: Lab, path: str, fmt: str | None = None) -> str:
    """Draw ``lab`` into ``path`` in ``fmt`` (svg or png; None: by the file name's suffix);
    returns the absolute path."""
    fmt = fmt or os.path.splitext(path)[1].lstrip(".").lower()
    if fmt not in FORMATS:
        raise PictureError(f"{path}: the file name must end in .svg or .png")
    data = render(scene(lab), fmt)
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
