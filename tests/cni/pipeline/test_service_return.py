"""The Conntrack and HostReturn tables on a real bridge (issue 26): a Pod reaches another Pod on
its Node through an address the Node's stack DNATs, and the reply goes back through that stack.

One Node (a netns with its own OVS, netdev bridge, the plugin's base flows as on a lone Node) and
two Pods A and B. The Node's nftables DNAT rule for a "Service" address is a stand-in for
kube-proxy's (the real kube-proxy, both modes, runs in tests/e2e/kube/test_kube_services.py): the
rule is what kube-proxy writes, minus the API server it would need. Then:

* A -> Service address: the connection completes, B saw A's address (no SNAT), A saw the
  Service address (the host undid its DNAT on the reply);
* with HostReturn's flows removed, the same connection cannot complete (B's reply reaches A
  straight from B's address); with them back it does again."""

from __future__ import annotations

import pytest

from cni.pipeline.tables import Table
from tests.support.podnode import Node, Pod, run

pytestmark = pytest.mark.root

SERVICE = {4: "10.96.0.5", 6: "fd00:10:96::5"}
PORT, TARGET = 80, 7000


def _dnat(node: Node, a: Pod, b: Pod) -> None:
    rules = "\n".join([
        "table inet svc {",
        "  chain pre { type nat hook prerouting priority -100;",
        f"    ip daddr {SERVICE[4]} tcp dport {PORT} dnat ip to {b.ip(4)}:{TARGET}",
        f"    ip6 daddr {SERVICE[6]} tcp dport {PORT} dnat ip6 to [{b.ip(6)}]:{TARGET}",
        "  }",
        "}", ""])
    run(["ip", "netns", "exec", node.name, "nft", "-f", "-"], input=rules)
    for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
        run(["ip", "netns", "exec", node.name, "sysctl", "-q", "-w", key])
    for p in (a, b):  # the Pods route the Service addresses through their gateway, as any off-link one
        run(["ip", "-n", p.netns, "route", "replace", "10.96.0.0/16", "via", p.gateway(4)])
        run(["ip", "-n", p.netns, "-6", "route", "replace", "fd00:10:96::/112", "via", p.gateway(6)])


def _connect(pod: Pod, addr: str, timeout: float) -> dict:
    return pod.connect(addr, PORT, timeout)


def _flows(node: Node, table: int) -> list[str]:
    return [f for f in node.flows() if f"table={table}," in f]


@pytest.mark.parametrize("family", (4, 6))
def test_a_dnated_connection_returns_through_the_host(node: Node, family: int) -> None:
    a, b = node.add_pod("svc-a"), node.add_pod("svc-b")
    _dnat(node, a, b)
    srv = b.serve(TARGET)
    try:
        r = _connect(a, SERVICE[family], 10)
        assert r["ok"], r
        assert r["peer"] == a.ip(family) and r["server"] == b.ip(family), r
        # Without HostReturn's flow the reply skips the host: the connection cannot complete.
        saved = [f for f in _flows(node, Table.CONNTRACK_STATE) if "ct_state" in f]
        assert saved, node.flows()
        node.ovs.ofctl("del-flows", node.bridge, f"table={int(Table.CONNTRACK_STATE)},ct_state=+trk+rpl")
        broken = _connect(a, SERVICE[family], 2)
        assert not broken["ok"], broken
        # Back: it works again (the flows, not anything else, made the difference).
        for f in saved:
            node.ovs.ofctl("add-flow", node.bridge, _readd(f))
        again = _connect(a, SERVICE[family], 10)
        assert again["ok"], (again, node.flows())
    finally:
        srv.kill()
        srv.wait()


def _readd(dumped: str) -> str:
    """An ``ovs-ofctl dump-flows`` line as ``add-flow`` text (counters and durations dropped)."""
    head, _, actions = dumped.strip().partition(" actions=")
    keep = [x for x in head.replace(", ", ",").split(",") if x.split("=")[0] not in
            ("duration", "n_packets", "n_bytes", "idle_age", "hard_age")]
    return ",".join(keep) + ",actions=" + actions
