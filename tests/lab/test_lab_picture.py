"""``ferry-lab show --svg/--png`` without root: the pairs and their paths from state files, the
graph Graphviz draws (segments holding their Nodes, each Node its Pods, the router, the
external host, one edge per pair styled by its path), and the SVG/PNG ``dot`` makes of it."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from lab import picture, topology
from lab.picture import NodeView, Scene

SVG = "{http://www.w3.org/2000/svg}"


def state(mode: str, peers: list[tuple[str, str, str]], tunnel: str | None = None) -> dict[str, Any]:
    """A state file: peers as (name, Pod CIDR, path)."""
    return {"mode": mode, "mtu": 1450, "tunnel": {"type": tunnel} if tunnel else None,
            "peers": [{"name": n, "addresses": [], "podCIDRs": [c], "path": p} for n, c, p in peers]}


CIDRS = {"node-1": ("10.244.1.0/24", "fd00:10:244:1::/64"), "node-2": ("10.244.2.0/24", "fd00:10:244:2::/64"),
         "node-3": ("10.244.3.0/24", "fd00:10:244:3::/64")}


def hybrid_states(fast: bool = False) -> dict[str, dict[str, Any]]:
    """The default lab in hybrid: node-1/node-2 routed on segment a, node-3 tunnelled."""
    near = "fast" if fast else "route"
    out = {}
    for me in CIDRS:
        peers = []
        for other, cidrs in CIDRS.items():
            if other != me:
                path = near if {me, other} == {"node-1", "node-2"} else "tunnel"
                peers += [(other, c, path) for c in cidrs]
        out[me] = state("hybrid", peers, "vxlan")
    return out


def scene(states: dict[str, dict[str, Any] | None], doc: dict | None = None) -> Scene:
    t = topology.parse(doc or {"routeSync": {"trafficEncapMode": "hybrid"}})
    views = tuple(NodeView(n.name, n.segment, tuple(a for a in topology.node_addresses(t, n) if a), n.pod_cidrs,
                           (("pod-1", ("10.244.1.2",)), ("pod-2", ("10.244.1.3",))), states.get(n.name))
                  for n in t.nodes)
    return Scene("tlpic", t, views)


def test_one_edge_per_pair_with_the_path_both_ends_name() -> None:
    edges = picture.peer_edges(hybrid_states())
    assert [(e.a, e.b, e.main, e.label()) for e in edges] == [
        ("node-1", "node-2", "route", "routed"),
        ("node-1", "node-3", "tunnel", "vxlan tunnel"),
        ("node-2", "node-3", "tunnel", "vxlan tunnel")]
    assert all(len(e.legs) == 4 for e in edges)  # 2 directions x 2 families


def test_pairs_whose_families_or_directions_differ_say_so() -> None:
    states = {"node-1": state("noEncap", [("node-2", "10.244.2.0/24", "fast"),
                                          ("node-2", "fd00:10:244:2::/64", "route")]),
              "node-2": state("noEncap", [("node-1", "10.244.1.0/24", "fast"),
                                          ("node-1", "fd00:10:244:1::/64", "fast")])}
    (e,) = picture.peer_edges(states)
    assert e.main == "fast"  # the fast path styles the edge
    assert e.label() == "IPv4 fast path\nIPv6 node-1→: routed\nIPv6 node-2→: fast path"
    # lone Nodes (no state file) name no peers: no edges
    assert picture.peer_edges({"node-1": None, "node-2": None}) == []
    # networkPolicyOnly: Ferry has no path, the primary CNI routes
    (e,) = picture.peer_edges({"node-1": state("networkPolicyOnly", [("node-2", "10.244.2.0/24", "none")])})
    assert e.label() == "no Ferry path"


def _dot_edges(source: str) -> dict[tuple[str, str], str]:
    """DOT ``a -- b [attrs]`` lines → attrs."""
    out = {}
    for m in re.finditer(r"^\s*(\S+) -- (\S+) \[(.*)\]$", source, re.MULTILINE):
        out[(m.group(1), m.group(2))] = m.group(3)
    return out


def test_graph_groups_nodes_by_segment_and_styles_each_pair() -> None:
    g = picture.graph(scene(hybrid_states(fast=True), {"routeSync": {"trafficEncapMode": "hybrid", "fastPath": True}}))
    src = g.source
    # segments as clusters holding their Nodes, each Node its Pods
    seg_a = src[src.index("subgraph cluster_seg_a"):src.index("subgraph cluster_seg_b")]
    assert "node_node_1 " in seg_a and "node_node_2 " in seg_a and "node_node_3 " not in seg_a
    assert "pod_node_3_pod_2" in src[src.index("subgraph cluster_seg_b"):]
    assert "192.168.77.0/24" in seg_a and "fd00:77::/64" in seg_a
    edges = _dot_edges(src)
    assert ("router", "external") in edges and ("router", "seg_a") in edges and ("seg_b", "node_node_3") in edges
    fast = edges[("node_node_1", "node_node_2")]
    assert 'label="fast path"' in fast and "style=bold" in fast and "constraint=false" in fast
    tunnel = edges[("node_node_1", "node_node_3")]
    assert 'label="vxlan tunnel"' in tunnel and "style=dashed" in tunnel
    assert f'color="{picture.TUNNEL_COLORS["vxlan"]}"' in tunnel
    peer_edges = [k for k in edges if k[0].startswith("node_") and k[1].startswith("node_")]
    assert len(peer_edges) == 3
    assert "hybrid, vxlan, fast path; Pods IPv4 + IPv6" in src  # the title
    assert "fast path (OVS → uplink)" in src and "vxlan tunnel" in src  # the legend


def test_single_stack_lab_draws_only_its_family() -> None:
    doc = {"clusterCIDRs": ["fd00:10:244::/48"], "routeSync": {"trafficEncapMode": "encap", "tunnelType": "gre"}}
    t = topology.parse(doc)
    states = {n.name: state("encap", [(m.name, m.pod_cidrs[0], "tunnel") for m in t.nodes if m != n], "gre")
              for n in t.nodes}
    src = picture.graph(scene(states, doc)).source
    assert "192.168." not in src and "fd00:99::2" in src and "Pods IPv6" in src
    assert src.count('label="gre tunnel"') == 3


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz (dot) not installed")
def test_svg_and_png_from_dot() -> None:
    sc = scene(hybrid_states())
    svg = ET.fromstring(picture.render(sc, "svg"))
    titles = {g.findtext(f"{SVG}title") for g in svg.iter(f"{SVG}g") if g.get("class") == "edge"}
    assert {"node_node_1--node_node_2", "node_node_1--node_node_3", "node_node_2--node_node_3"} <= titles
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    assert "routed" in texts and texts.count("vxlan tunnel") >= 2 and "external host" in texts
    png = picture.render(sc, "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    with pytest.raises(picture.PictureError, match="format 'pdf'"):
        picture.render(sc, "pdf")
