"""``ferry-lab``: a multi-Node Ferry cluster on one machine (namespaces + one OVS per Node).

    ferry-lab up [-f topology.yaml] [--name NAME] [--cni-bin DIR]
    ferry-lab pod add NODE POD / pod del NODE POD
    ferry-lab check [--only same-node ...]
    ferry-lab show
    ferry-lab down [--name NAME]
    ferry-lab demo            # up + 2 Pods per Node + check + show; leaves the lab up

The lab name defaults to $FERRY_LAB_NAME or "demo"."""

from __future__ import annotations

import os
import sys
import time

import click

from lab import build, check, tools
from lab.api import Lab, default_cni_bin, ensure_cni_bin
from lab.sh import LabError
from lab.topology import CATEGORIES, TopologyError, node_netns

DEFAULT_NAME = os.environ.get("FERRY_LAB_NAME", "demo")
name_option = click.option("--name", "-n", default=DEFAULT_NAME, show_default=True, help="lab name")


def _fail(e: Exception) -> None:
    click.echo(f"ferry-lab: {e}", err=True)
    sys.exit(1)


@click.group(help=__doc__)
def main() -> None:
    pass


kubernetes_option = click.option(
    "--kubernetes", is_flag=True, default=False,
    help="a real Kubernetes cluster: etcd, kube-apiserver, controller-manager and scheduler on the external "
         "host, containerd + kubelet on every Node, Ferry from deploy/ferry.yaml (topology key `kubernetes`)")


def topology_doc(path: str | None, kubernetes: bool) -> str | dict | None:
    """The topology to build: the file (or the default) as is, or with the ``kubernetes`` key set."""
    if not kubernetes:
        return path
    import yaml

    from lab.topology import DEFAULT_TOPOLOGY

    with open(path or DEFAULT_TOPOLOGY) as f:
        doc = yaml.safe_load(f) or {}
    doc["kubernetes"] = doc.get("kubernetes") or {}
    return doc


def kube_hint(lab: Lab) -> str:
    kc = lab.manifest.info.get("kubeconfig")
    name = "" if lab.name == DEFAULT_NAME else f" --name {lab.name}"
    return (f"Kubernetes: ferry-lab kubectl{name} -- get nodes,pods -A -o wide   (kubectl {tools.tool('kubectl')}"
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
@kubernetes_option
def up(topology: str | None, name: str, cni_bin: str | None, kubernetes: bool) -> None:
    t0 = time.monotonic()
    try:
        lab = Lab.up(topology_doc(topology, kubernetes), name=name, cni_bin=cni_bin,
                     log=lambda s: click.echo(f"  {s}", err=True))
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
@name_option
def check_cmd(only: tuple[str, ...], name: str) -> None:
    try:
        lab = Lab.attach(name)
        rows = check.run(lab, only)
    except LabError as e:
        _fail(e)
    click.echo(check.table(lab, rows))
    if not rows:
        click.echo("no probes: add Pods first (ferry-lab pod add NODE POD)", err=True)
        sys.exit(1)
    sys.exit(0 if all(r.ok for r in rows) else 1)


@main.command(help="Nodes, Pods, addresses, and per-peer paths from each Node's state file.")
@name_option
def show(name: str) -> None:
    try:
        lab = Lab.attach(name)
    except LabError as e:
        _fail(e)
    click.echo(render(lab))


def render(lab: Lab) -> str:
    out = [f"lab {lab.name} ({lab.dir}), {'route-sync' if lab.route_sync else 'lone-Node mode'}"]
    out.append(f"router {lab.router.netns}: {', '.join(lab.router.addresses)}; "
               f"routes Pod CIDRs: {lab.topology.route_pod_cidrs}")
    out.append(f"external {lab.external.netns}: {', '.join(lab.external.addresses)}")
    for n in lab.nodes:
        alive = "ovs ok" if n.vswitchd_answers() else "ovs DOWN"
        out.append(f"node {n.name} [{node_netns(lab.name, n.name)}] segment {n.spec.segment}, "
                   f"{n.ipv4} {n.ipv6}, Pod CIDRs {' '.join(n.spec.pod_cidrs)}, {n.spec.datapath}, {alive}")
        state = n.state()
        if state is None:
            out.append("    state: none (no route-sync: lone Node)")
        else:
            tun = state.get("tunnel") or {}
            out.append(f"    state: mode {state.get('mode')}, mtu {state.get('mtu')}, "
                       f"tunnel {tun.get('type', '-')}")
            for p in state.get("peers") or []:
                out.append(f"    peer {p['name']}: path {p['path']} via {', '.join(p['addresses'])} "
                           f"for {', '.join(p['podCIDRs'])}" + (f" mac {p['mac']}" if p.get("mac") else ""))
        for p in n.pods():
            out.append(f"    pod {p.name} [{p.netns}]: {' '.join(p.ips)} mac {p.mac}")
    return "\n".join(out)


@main.command(help="up + 2 Pods on every Node + check (of what is configured) + show; leaves the lab up.")
@click.option("-f", "--file", "topology", type=click.Path(exists=True, dir_okay=False), default=None)
@name_option
@click.option("--cni-bin", default=None)
@kubernetes_option
def demo(topology: str | None, name: str, cni_bin: str | None, kubernetes: bool) -> None:
    t0 = time.monotonic()
    try:
        cni_bin = ensure_cni_bin(os.path.abspath(cni_bin or default_cni_bin()))
        lab = Lab.up(topology_doc(topology, kubernetes), name=name, cni_bin=cni_bin,
                     log=lambda s: click.echo(f"  {s}", err=True))
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
    click.echo("")
    click.echo(render(lab))
    down_cmd = "make demo-down" if name == "demo" else f"ferry-lab down --name {name}"
    click.echo(f"\nThe lab stays up. Try: ferry-lab --help, ip netns exec {lab.pods()[0].netns} ping ...; "
               f"tear it down with `{down_cmd}` (= ferry-lab down --name {name}).")
    if lab.kubernetes:
        click.echo(kube_hint(lab))
    sys.exit(0 if all(r.ok for r in rows) else 1)


if __name__ == "__main__":
    main()
