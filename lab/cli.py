"""``ferry-lab``: a multi-Node Ferry cluster on one machine (namespaces + one OVS per Node).

    ferry-lab up [-f topology.yaml] [--name NAME] [--cni-bin DIR] [MODE FLAGS]
    ferry-lab pod add NODE POD / pod del NODE POD
    ferry-lab check [--only same-node ...]
    ferry-lab show [--svg FILE] [--png FILE]
    ferry-lab down [--name NAME]
    ferry-lab demo [MODE FLAGS] [--picture FILE]   # up + 2 Pods per Node + check + show; leaves the lab up

MODE FLAGS override the topology's keys: --mode encap|noEncap|hybrid|networkPolicyOnly,
--tunnel vxlan|geneve|gre, --fast-path, --family 4|6|dual, --vlan 1..4094,
--encryption none|wireguard (lab/overrides.py).

The lab name defaults to $FERRY_LAB_NAME or "demo"."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from cni.pipeline.modes import ENCRYPTION_NONE, ENCRYPTIONS, MODES, NETDEV_TUNNEL_TYPES, PATH_TUNNEL, PATH_WIREGUARD
from lab import build, check, frr, overrides, picture, tools, wirecapture, wireguard
from lab.api import Lab, Node, default_cni_bin, ensure_cni_bin
from lab.conformance.cli import conformance as conformance_cmd
from lab.kube.spec import INSTALLERS, KUBE_PROXY_MODES
from lab.sh import LabError
from lab.topology import CATEGORIES, TopologyError, node_netns, router_routes
from routesync.config import OVS_DAEMONS

DEFAULT_NAME = os.environ.get("FERRY_LAB_NAME", "demo")
name_option = click.option("--name", "-n", default=DEFAULT_NAME, show_default=True, help="lab name")


def _fail(e: Exception) -> None:
    click.echo(f"ferry-lab: {e}", err=True)
    sys.exit(1)


def mode_options(f: Callable[..., None]) -> Callable[..., None]:
    """--mode, --tunnel, --fast-path, --family: override the topology's keys (lab.overrides)."""
    for opt in reversed((
        click.option("--mode", type=click.Choice(MODES), default=None,
                     help="routeSync.trafficEncapMode (and the underlay routes the mode needs)"),
        click.option("--tunnel", type=click.Choice(NETDEV_TUNNEL_TYPES), default=None,
                     help="routeSync.tunnelType (encap, hybrid)"),
        click.option("--fast-path", is_flag=True, default=False, help="routeSync.fastPath (noEncap, hybrid)"),
        click.option("--family", type=click.Choice(tuple(overrides.FAMILY_CHOICES)), default=None,
                     help="address families of Pods and underlay"),
        click.option("--vlan", type=click.IntRange(1, 4094), default=None,
                     help="vlan: every segment an 802.1Q switch carrying this VLAN, route-sync's transportVLAN"),
        click.option("--encryption", type=click.Choice(ENCRYPTIONS), default=None,
                     help="encryption: Pod traffic between Nodes through each Node's WireGuard device "
                          "(route-sync's trafficEncryptionMode; the userspace wireguard-go here)"),
    )):
        f = opt(f)
    return f


def _doc(topology: str | None, mode: str | None, tunnel: str | None, fast_path: bool, family: str | None,
         kubernetes: bool = False, kube_proxy: str | None = None, ovs_daemons: str | None = None,
         vlan: int | None = None, encryption: str | None = None, installer: str | None = None) -> dict[str, Any]:
    doc = overrides.load(topology, overrides.Overrides(mode, tunnel, fast_path, family, vlan, encryption))
    if kubernetes or kube_proxy or ovs_daemons or installer:
        doc["kubernetes"] = dict(doc.get("kubernetes") or {})
        if installer:
            doc["kubernetes"]["installer"] = installer
        if kube_proxy:
            doc["kubernetes"]["kubeProxy"] = kube_proxy
        if ovs_daemons:
            doc["kubernetes"]["ovsDaemons"] = ovs_daemons
    return doc


@click.group(help=__doc__)
def main() -> None:
    pass


def kubernetes_option(f: Callable[..., None]) -> Callable[..., None]:
    """--kubernetes, --kube-proxy, --ovs and --installer (which imply --kubernetes)."""
    f = click.option(
        "--installer", type=click.Choice(INSTALLERS), default=None,
        help="how Ferry goes on the cluster (kubernetes.installer; default kubectl): kubectl applies "
             "deploy/ferry.yaml, helm runs `helm install` of deploy/helm/ferry")(f)
    f = click.option(
        "--ovs", "ovs_daemons", type=click.Choice(OVS_DAEMONS), default=None,
        help="who runs each Node's Open vSwitch (kubernetes.ovsDaemons; default host): host (the lab starts it) or "
             "ferry (the Nodes have none; Ferry's DaemonSet runs it in its openvswitch container)")(f)
    f = click.option(
        "--kube-proxy", "kube_proxy", type=click.Choice(KUBE_PROXY_MODES), default=None,
        help="kube-proxy's mode on every Node (kubernetes.kubeProxy; default iptables): none runs no kube-proxy and "
             "no CoreDNS")(f)
    return click.option(
        "--kubernetes", is_flag=True, default=False,
        help="a real Kubernetes cluster: etcd, kube-apiserver, controller-manager and scheduler on the external "
             "host, containerd + kubelet + kube-proxy on every Node, CoreDNS, Ferry from deploy/ferry.yaml "
             "(topology key `kubernetes`)")(f)


def invoked_as() -> str:
    """How the user can call ferry-lab again: its name when PATH finds this one, else the path
    they used (``.venv/bin/ferry-lab`` from a fresh clone)."""
    argv0 = sys.argv[0]
    found = shutil.which("ferry-lab")
    if found and os.path.realpath(found) == os.path.realpath(argv0):
        return "ferry-lab"
    return os.path.relpath(argv0) if os.path.basename(argv0) == "ferry-lab" else "ferry-lab"


def kube_hint(lab: Lab) -> str:
    kc = lab.manifest.info.get("kubeconfig")
    name = "" if lab.name == DEFAULT_NAME else f" --name {lab.name}"
    return (f"Kubernetes: {invoked_as()} kubectl{name} -- get nodes,pods -A -o wide   (kubectl {tools.tool('kubectl')}"
            f" with KUBECONFIG={kc}, run in the external host's netns, where the API server is)" if kc else "")


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
              help="kubectl against the lab's Kubernetes cluster (admin kubeconfig, external host's netns).")
@name_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def kubectl(name: str, args: tuple[str, ...]) -> None:
    from lab.kube.cluster import kubectl_argv

    try:
        lab = Lab.attach(name)
        argv = kubectl_argv(lab.kube().plan, list(args))
    except LabError as e:
        _fail(e)
    os.execvp(argv[0], argv)


@main.command(help="Build a lab from a topology (default: 3 Nodes, 2 segments, a router, an external host).")
@click.option("-f", "--file", "topology", type=click.Path(exists=True, dir_okay=False), default=None)
@name_option
@click.option("--cni-bin", default=None, help="CNI_PATH with ferry (default $FERRY_CNI_BIN or build/cni-bin)")
@mode_options
@kubernetes_option
def up(topology: str | None, name: str, cni_bin: str | None, mode: str | None, tunnel: str | None,
       fast_path: bool, family: str | None, vlan: int | None, encryption: str | None, kubernetes: bool,
       kube_proxy: str | None, ovs_daemons: str | None, installer: str | None) -> None:
    t0 = time.monotonic()
    try:
        doc = _doc(topology, mode, tunnel, fast_path, family, kubernetes, kube_proxy, ovs_daemons, vlan, encryption,
                   installer)
        lab = Lab.up(doc, name=name, cni_bin=cni_bin, log=lambda s: click.echo(f"  {s}", err=True))
    except (LabError, TopologyError, OSError) as e:
        _fail(e)
    click.echo(f"lab {lab.name} up in {time.monotonic() - t0:.2f}s: {len(lab.nodes)} Nodes "
               f"({'route-sync' if lab.route_sync else 'lone-Node mode, no route-sync'}), dir {lab.dir}")
    if lab.kubernetes:
        click.echo(kube_hint(lab))


@main.command(help="Remove everything the lab created (from its on-disk manifest).")
@name_option
def down(name: str) -> None:
    t0 = time.monotonic()
    try:
        removed = build.down(name)
    except LabError as e:
        _fail(e)
    click.echo(f"lab {name} removed in {time.monotonic() - t0:.2f}s" if removed else f"no lab named {name}")


@main.command(help="Reboot a Node of a Kubernetes lab (lab/kube/reboot.py): its processes, mounts, /run and "
                   "network state lost, /var/lib and its NIC kept, then started again; waits for the lab's Pods "
                   "on it to run again and attaches them anew.")
@click.argument("node")
@click.option("--timeout", default=180.0, show_default=True, help="seconds to wait for each Pod (a hang)")
@name_option
def reboot(node: str, timeout: float, name: str) -> None:
    try:
        lab = Lab.attach(name)
        pods = [p.name for p in lab.node(node).pods()]
        kubelet = lab.reboot(node)
        click.echo(f"{node} rebooted; the kubelet started; waiting for {', '.join(pods) or 'no lab Pod'}")
        for p in pods:
            pod = lab.await_kube_pod_back(node, p, timeout)
            click.echo(f"{node}/{p}: back {time.monotonic() - kubelet:.1f}s after the kubelet's start, "
                       f"{' '.join(pod.ips)}")
    except (LabError, TopologyError) as e:
        _fail(e)


@main.group(help="Add or delete a Pod (a netns plugged by the ferry plugin through cnitool).")
def pod() -> None:
    pass


@pod.command("add")
@click.argument("node")
@click.argument("pod_name")
@name_option
def pod_add(node: str, pod_name: str, name: str) -> None:
    try:
        p = Lab.attach(name).add_pod(node, pod_name)
    except (LabError, TopologyError) as e:
        _fail(e)
    click.echo(f"{p.node}/{p.name}: netns {p.netns}, {' '.join(p.ips)}, mac {p.mac}")


@pod.command("del")
@click.argument("node")
@click.argument("pod_name")
@name_option
def pod_del(node: str, pod_name: str, name: str) -> None:
    try:
        Lab.attach(name).del_pod(node, pod_name)
    except LabError as e:
        _fail(e)
    click.echo(f"{node}/{pod_name} deleted")


@main.command("check", help="Connectivity matrix (ping + TCP, IPv4 + IPv6); non-zero exit on any failure.")
@click.option("--only", multiple=True, type=click.Choice(CATEGORIES), help="run only these categories")
@click.option("--wire", is_flag=True, default=False,
              help="capture every port of the underlay's segments meanwhile and say what crossed between Nodes "
                   "and which Pod addresses were on the wire (outer or inside a tunnel); on an encrypted lab any "
                   "Pod address fails the check")
@click.option("--pcap-dir", type=click.Path(file_okay=False), default=None,
              help="with --wire: keep the captures (one pcap per segment port) in this directory")
@name_option
def check_cmd(only: tuple[str, ...], wire: bool, pcap_dir: str | None, name: str) -> None:
    evidence = None
    try:
        lab = Lab.attach(name)
        if wire:
            with wirecapture.WireCapture(lab, keep=pcap_dir) as cap:
                rows = check.run(lab, only)
                evidence = cap.evidence()
        else:
            rows = check.run(lab, only)
    except LabError as e:
        _fail(e)
    click.echo(check.table(lab, rows))
    if not rows:
        click.echo("no probes: add Pods first (ferry-lab pod add NODE POD)", err=True)
        sys.exit(1)
    leaked = False
    if evidence is not None:
        click.echo(f"\non the wire meanwhile (encryption {lab.topology.encryption}):\n{evidence.report()}")
        if pcap_dir:
            click.echo(f"captures: {os.path.abspath(pcap_dir)}")
        leaked = lab.topology.encrypted and bool(evidence.sightings)
        if leaked:
            click.echo("FAIL: Pod addresses crossed the underlay of an encrypted lab", err=True)
    sys.exit(0 if all(r.ok for r in rows) and not leaked else 1)


@main.command(help="Nodes, Pods, addresses, and per-peer paths from each Node's state file; "
                   "--svg/--png also draw them (Graphviz).")
@name_option
@click.option("--svg", "svg", type=click.Path(dir_okay=False), default=None, help="draw the lab into this SVG file")
@click.option("--png", "png", type=click.Path(dir_okay=False), default=None, help="draw the lab into this PNG file")
def show(name: str, svg: str | None, png: str | None) -> None:
    try:
        lab = Lab.attach(name)
        click.echo(render(lab))
        for path, fmt in ((svg, "svg"), (png, "png")):
            if path:
                click.echo(f"picture: {picture.draw(lab, path, fmt)}")
    except (LabError, picture.PictureError) as e:
        _fail(e)


def _pod_mtus(pod) -> str:  # type: ignore[no-untyped-def]
    """`` mtu 1500; routes default 1500, 10.244.0.0/16 1450`` as the Pod holds them now."""
    try:
        link = pod.exec(["ip", "-o", "link", "show", "eth0"])
        routes = pod.exec(["ip", "route", "show"]).stdout + pod.exec(["ip", "-6", "route", "show"]).stdout
    except Exception:  # noqa: BLE001 - show is best effort per Pod
        return ""
    found = re.search(r" mtu (\d+)", link.stdout)
    parts = [f"{line.split()[0]} {m.group(1)}" for line in routes.splitlines()
             if " via " in line and (m := re.search(r" mtu (\d+)", line))]
    return (f" mtu {found.group(1)}" if found else "") + (f"; routes {', '.join(parts)}" if parts else "")


def _router_bgp(lab: Lab) -> list[str]:
    """The router's BGP neighbours (FRR) and the routes it installed from them."""
    rb = lab.topology.router_bgp
    assert rb is not None
    out = [f"    bgp: FRR AS {rb.asn}, Nodes AS {rb.node_asn}, hold time {rb.hold_time}s"]
    try:
        for addr, n in sorted(frr.summary(lab.dir, lab.name).items()):
            rcv = ", ".join(f"IPv{f} {c}" for f, c in sorted(n["received"].items()))
            out.append(f"    bgp neighbour {addr} AS {n['asn']}: {n['state']}, received {rcv}")
        for r in frr.routes(lab.router.netns):
            out.append(f"    route {r['dst']} via {r['via']} dev {r['dev']} proto {r['protocol']}")
    except (LabError, ValueError) as e:
        out.append(f"    bgp: cannot read FRR ({e})")
    return out


def _node_bgp(n: Node) -> list[str]:
    from routesync.bgp import status as bgp_status

    st = bgp_status.read(os.path.join(os.path.dirname(n.paths.state_file), "bgp"))
    if st is None:
        return ["    bgp: no status (route-sync not running, or not written yet)"]
    out = [f"    bgp: AS {st.local_asn} router-id {st.router_id or '-'}, ExaBGP {st.speaker}"]
    for p in st.peers:
        out.append(f"    bgp peer {p.address} AS {p.asn}: {p.state}, advertised {', '.join(p.advertised) or '-'}"
                   + (f", last error: {p.last_error}" if p.last_error else ""))
    return out


def _wireguard_processes(n: Node) -> str:
    """The userspace WireGuard processes in the Node's namespace (route-sync starts them), by pid."""
    pids = wireguard.pids(n.netns)
    return f"wireguard-go pid {', '.join(map(str, pids))}" if pids else "no wireguard-go process"


def render(lab: Lab) -> str:
    out = [f"lab {lab.name} ({lab.dir}), {'route-sync' if lab.route_sync else 'lone-Node mode'}"]
    out.append(f"router {lab.router.netns}: {', '.join(lab.router.addresses)}; "
               f"routes Pod CIDRs: {router_routes(lab.topology)}")
    if lab.topology.router_bgp is not None:
        out += _router_bgp(lab)
    out.append(f"external {lab.external.netns}: {', '.join(lab.external.addresses)}")
    if lab.kubernetes:
        out.append(f"kubernetes: API {lab.kube().plan.api_url}, Pod CIDRs from the controller-manager")
    for n in lab.nodes:
        alive = "ovs ok" if n.vswitchd_answers() else "ovs DOWN"
        state = n.state()
        # on a Kubernetes lab the Node's Pod CIDRs are the controller-manager's (route-sync's state)
        cidrs = (state or {}).get("podCIDRs") if lab.kubernetes else None
        tag = "" if lab.topology.vlan is None else f" (VLAN {lab.topology.vlan}, this Node tags " + \
            (f"{n.spec.vlan})" if n.spec.vlan is not None else "nothing)")
        out.append(f"node {n.name} [{node_netns(lab.name, n.name)}] segment {n.spec.segment}{tag}, "
                   f"{' '.join(a for a in n.addresses if a)}, Pod CIDRs {' '.join(cidrs or n.spec.pod_cidrs)}, "
                   f"{n.spec.datapath}, {alive}")
        if lab.topology.router_bgp is not None:
            out += _node_bgp(n)
        if state is None:
            out.append("    state: none (no route-sync: lone Node)")
        else:
            tun = state.get("tunnel") or {}
            full = state.get("transportMTU") or state.get("mtu")
            enc = state.get("encryption") or ENCRYPTION_NONE
            if enc == ENCRYPTION_NONE:
                other = f"{state.get('mtu')} tunnelled, tunnel {tun.get('type', '-')}"
            else:  # every peer through the WireGuard device, whatever the mode
                other = f"{state.get('mtu')} to every peer, encryption {enc} ({_wireguard_processes(n)})"
            out.append(f"    state: mode {state.get('mode')}, mtu {full} (Pods, routed, non-Pod), {other}")
            for p in state.get("peers") or []:
                mtu = state.get("mtu") if p["path"] in (PATH_TUNNEL, PATH_WIREGUARD) else full
                out.append(f"    peer {p['name']}: path {p['path']} mtu {mtu} via {', '.join(p['addresses'])} "
                           f"for {', '.join(p['podCIDRs'])}" + (f" mac {p['mac']}" if p.get("mac") else ""))
        for p in n.pods():
            out.append(f"    pod {p.name} [{p.netns}]: {' '.join(p.ips)} mac {p.mac}{_pod_mtus(p)}")
    return "\n".join(out)


@main.command(help="up + 2 Pods on every Node + check (of what is configured) + show; leaves the lab up.")
@click.option("-f", "--file", "topology", type=click.Path(exists=True, dir_okay=False), default=None)
@name_option
@click.option("--cni-bin", default=None)
@mode_options
@kubernetes_option
@click.option("--picture", "picture_file", type=click.Path(dir_okay=False), default=None,
              help="also draw the lab into this .svg or .png file")
def demo(topology: str | None, name: str, cni_bin: str | None, mode: str | None, tunnel: str | None,
         fast_path: bool, family: str | None, vlan: int | None, encryption: str | None, kubernetes: bool,
         kube_proxy: str | None, ovs_daemons: str | None, installer: str | None, picture_file: str | None) -> None:
    t0 = time.monotonic()
    try:
        doc = _doc(topology, mode, tunnel, fast_path, family, kubernetes, kube_proxy, ovs_daemons, vlan, encryption,
                   installer)
        cni_bin = ensure_cni_bin(os.path.abspath(cni_bin or default_cni_bin()))
        lab = Lab.up(doc, name=name, cni_bin=cni_bin, log=lambda s: click.echo(f"  {s}", err=True))
        click.echo(f"lab {name} up in {time.monotonic() - t0:.2f}s")
        for n in lab.nodes:
            for i in (1, 2):
                p = lab.add_pod(n.name, f"pod-{i}")
                click.echo(f"  {p.node}/{p.name}: {' '.join(p.ips)}")
        rows = check.run(lab)
    except (LabError, TopologyError) as e:
        _fail(e)
    click.echo("")
    click.echo(check.table(lab, rows))
    if lab.kubernetes and lab.kube().plan.dns_ip and len(lab.nodes) > 1:
        from lab.kube import services

        try:
            svc_rows = services.demo(lab, lab.nodes[0].pods()[0], lab.nodes[1].pods()[0])
        except LabError as e:
            _fail(e)
        click.echo("\nServices and cluster DNS (kube-proxy "
                   f"{lab.kube().plan.kube_proxy} mode, CoreDNS as kube-dns):")
        for what, ok, detail in svc_rows:
            click.echo(f"  {'ok  ' if ok else 'FAIL'} {what}: {detail}")
        rows_failed = not all(ok for _w, ok, _d in svc_rows)
    else:
        rows_failed = False
    click.echo("")
    click.echo(render(lab))
    if picture_file:
        try:
            click.echo(f"\npicture of the lab: {picture.draw(lab, picture_file)}")
        except picture.PictureError as e:
            _fail(e)
    down_cmd = "make demo-down" if name == "demo" else f"ferry-lab down --name {name}"
    click.echo(f"\nThe lab stays up. Try: ferry-lab --help, ip netns exec {lab.pods()[0].netns} ping ...; "
               f"tear it down with `{down_cmd}` (= ferry-lab down --name {name}).")
    if lab.kubernetes:
        click.echo(kube_hint(lab))
    sys.exit(0 if all(r.ok for r in rows) and not rows_failed else 1)


main.add_command(conformance_cmd)


if __name__ == "__main__":
    main()
