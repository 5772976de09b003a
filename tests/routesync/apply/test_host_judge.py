"""The host's NetworkPolicy judge (table inet ferry_policy) on real NATed connections.

A Node namespace routes for its Pods (behind ``ferry-gw0``) and reaches an external host on its
uplink.  kube-proxy's part is played by three nft NAT rules of its shape (a ClusterIP DNAT in
prerouting, a NodePort DNAT + masquerade): kube-proxy itself needs an API server, and the
Kubernetes suite (tests/e2e/kube/test_kube_failopen.py) runs the real one against the same
judge; here each verdict is read off the judge's own drop counter and the server's accepts."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from routesync.apply.nft import POLICY_TABLE, NftApplier
from routesync.nftbody import NftBody
from routesync.policy import hostjudge as hj
from routesync.policy import plan as pp
from routesync.policy.model import Pod, policy_from
from tests.routesync.apply.helpers import ns_sh, veth
from tests.support import nftlisting
from tests.support.ovs_instance import netns
from tests.support.waiting import HANG

pytestmark = pytest.mark.root

Names = tuple[str, str, str, str, str]  # the lab's namespaces: Node, client, server, free Pod, external host
CLI = Pod("a", "cli", "n1", (("app", "cli"),), ("10.244.1.5", "fd00:244:1::5"))
SRV = Pod("a", "srv", "n1", (("app", "srv"),), ("10.244.1.6",))
FREE = Pod("b", "free", "n1", (), ("10.244.1.7",))

KUBE_PROXY = """table inet kp {
	chain pre {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.1 tcp dport 443 dnat ip to 192.168.77.2:6443
		ip daddr 10.96.0.2 tcp dport 80 dnat ip to 192.168.77.1:8080
		ip daddr 10.96.0.3 tcp dport 80 dnat ip to 10.244.1.6:80
		ip6 daddr fd00:96::1 tcp dport 443 dnat ip6 to [fd00:77::2]:6443
		ip daddr 192.168.77.1 tcp dport 30080 dnat ip to 10.244.1.6:80
	}
	chain out {
		type nat hook output priority -100; policy accept;
		ip daddr 192.168.77.1 tcp dport 30080 dnat ip to 10.244.1.6:80
	}
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ip daddr 10.244.1.6 tcp dport 80 ct status dnat ct original ip daddr 192.168.77.1 masquerade
	}
}
"""

SERVE = """
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(16)
print("ready", flush=True)
while True:
    c, peer = s.accept()
    print(peer[0], flush=True)
    c.close()
"""
CONNECT = """
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
"""


def plan(*policies: dict) -> pp.Plan:
    return pp.plan(pp.Inputs((CLI, SRV, FREE), {"a": (), "b": ()}, tuple(policy_from(d) for d in policies)),
                   pp.NodeFacts("n1"))


def pol(name: str, app: str, types: list[str], **rules: list) -> dict:
    return {"metadata": {"namespace": "a", "name": name},
            "spec": {"podSelector": {"matchLabels": {"app": app}}, "policyTypes": types, **rules}}


DENY_EGRESS = pol("deny-out", "cli", ["Egress"])
DENY_INGRESS = pol("deny-in", "srv", ["Ingress"])
API_ALLOWED = pol("api", "cli", ["Egress"], egress=[{"to": [{"ipBlock": {"cidr": "192.168.77.2/32"}}],
                                                     "ports": [{"port": 6443}]}])


@contextmanager
def servers(ns: str, *where: tuple[str, int]) -> Iterator[dict[tuple[str, int], subprocess.Popen[str]]]:
    """TCP servers in ``ns`` that print each accepted peer."""
    with ExitStack() as stack:
        out = {}
        for addr, port in where:
            p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVE, addr, str(port)],
                                 stdout=subprocess.PIPE, text=True)
            stack.callback(p.wait)
            stack.callback(p.kill)
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            out[(addr, port)] = p
        yield out


def connects(ns: str, addr: str, port: int) -> bool:
    """An allowed connection: completes (a generous bound that only a broken path reaches)."""
    p = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, addr, str(port), str(HANG)],
                       capture_output=True, text=True, check=False, timeout=HANG + 10)
    return p.returncode == 0


def drops(node: str, chain: str) -> int:
    text = ns_sh(node, "nft", "list", "chain", "inet", POLICY_TABLE, chain)
    # every counted drop of the chain: the isolation's, and each ClusterNetworkPolicy Deny's (per family)
    return sum(int(ln.split("counter packets")[1].split()[0]) for ln in text.splitlines()
               if "counter packets" in ln and "drop" in ln)


def denied(node: str, chain: str, ns: str, addr: str, port: int) -> bool:
    """A connection attempt whose first packet the judge's ``chain`` drops: its counter moves
    (waited for, not guessed), and the attempt never completes meanwhile."""
    before = drops(node, chain)
    p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", CONNECT, addr, str(port), str(HANG)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + HANG
        while drops(node, chain) == before:
            if p.poll() is not None or time.monotonic() > deadline:
                return False  # completed (or failed some other way) without the judge
            time.sleep(0.05)
        return p.poll() is None
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def lab() -> Iterator[Names]:
    with ExitStack() as stack:
        node, cli, srv, free, ext = (stack.enter_context(netns(n)) for n in
                                     ("fb-hj", "fb-hjc", "fb-hjs", "fb-hjf", "fb-hje"))
        ns_sh(node, "ip", "link", "add", "ferry-gw0", "type", "bridge")
        ns_sh(node, "ip", "link", "set", "ferry-gw0", "up")
        ns_sh(node, "ip", "addr", "add", "10.244.1.1/24", "dev", "ferry-gw0")
        ns_sh(node, "ip", "addr", "add", "fd00:244:1::1/64", "dev", "ferry-gw0", "nodad")
        for i, (pod, ip) in enumerate(((cli, "10.244.1.5"), (srv, "10.244.1.6"), (free, "10.244.1.7"))):
            veth(node, f"p{i}", pod, "eth0")
            ns_sh(node, "ip", "link", "set", f"p{i}", "master", "ferry-gw0")
            ns_sh(pod, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
            ns_sh(pod, "ip", "route", "add", "default", "via", "10.244.1.1")
        ns_sh(cli, "ip", "addr", "add", "fd00:244:1::5/64", "dev", "eth0", "nodad")
        ns_sh(cli, "ip", "-6", "route", "add", "default", "via", "fd00:244:1::1")
        veth(node, "eth0", ext, "eth0")
        ns_sh(node, "ip", "addr", "add", "192.168.77.1/24", "dev", "eth0")
        ns_sh(node, "ip", "addr", "add", "fd00:77::1/64", "dev", "eth0", "nodad")
        ns_sh(node, "ip", "route", "add", "10.96.0.0/16", "via", "192.168.77.2")  # an unrouted ClusterIP leaves
        for key in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
            ns_sh(node, "sysctl", "-q", "-w", key)
        ns_sh(ext, "ip", "addr", "add", "192.168.77.2/24", "dev", "eth0")
        ns_sh(ext, "ip", "addr", "add", "fd00:77::2/64", "dev", "eth0", "nodad")
        ns_sh(ext, "ip", "addr", "add", "10.96.0.9/32", "dev", "eth0")
        ns_sh(ext, "ip", "route", "add", "10.244.0.0/16", "via", "192.168.77.1")
        ns_sh(ext, "ip", "-6", "route", "add", "fd00:244::/32", "via", "fd00:77::1")
        subprocess.run(["ip", "netns", "exec", node, "nft", "-f", "-"], input=KUBE_PROXY, text=True, check=True)
        yield node, cli, srv, free, ext


@pytest.fixture
def nft(lab: Names) -> Iterator[NftApplier]:
    """The applier route-sync writes the judge with, in the Node's namespace (its tables go with it)."""
    applier = NftApplier(netns=lab[0])
    yield applier
    applier.close()


def judge_with(nft: NftApplier, *policies: dict) -> None:
    j = hj.judge(plan(*policies), "ferry-gw0", ["10.244.1.1/24", "192.168.77.1/24", "fd00:77::1/64"],
                 ["10.96.0.0/16", "fd00:96::/112"])
    nft.sync_policy(hj.render_body(j))


def test_egress_is_judged_on_the_destination_kube_proxy_chose(lab: Names, nft: NftApplier) -> None:
    node, cli, _srv, free, ext = lab
    with servers(ext, ("::", 6443), ("10.96.0.9", 80)), servers(node, ("192.168.77.1", 8080)):
        judge_with(nft)  # no policy: every Service reached
        assert connects(cli, "10.96.0.1", 443) and connects(cli, "10.96.0.2", 80)
        judge_with(nft, DENY_EGRESS)
        assert denied(node, "egress", cli, "10.96.0.1", 443)  # the "API server", off the Pod network
        assert denied(node, "egress", cli, "10.96.0.2", 80)  # a hostNetwork backend on this Node (input)
        assert denied(node, "egress", cli, "fd00:96::1", 443)  # IPv6
        assert denied(node, "egress", cli, "10.96.0.9", 80)  # a ClusterIP kube-proxy left alone
        assert connects(free, "10.96.0.1", 443)  # positive control: a Pod without policy
        judge_with(nft, DENY_EGRESS, API_ALLOWED)
        assert connects(cli, "10.96.0.1", 443)  # allowed by an ipBlock on the DNATed address and port
        assert denied(node, "egress", cli, "10.96.0.2", 80)


def test_a_pod_backend_is_left_to_ovs(lab: Names, nft: NftApplier) -> None:
    """A DNATed connection that goes back out of the gateway (into OVS) is not the host's to judge."""
    node, cli, srv, _free, _ext = lab
    with servers(srv, ("10.244.1.6", 80)):
        judge_with(nft, DENY_EGRESS)
        before = drops(node, "egress")
        assert connects(cli, "10.96.0.3", 80)
        assert drops(node, "egress") == before


def test_nodeport_ingress_is_judged_by_the_original_client(lab: Names, nft: NftApplier) -> None:
    node, _cli, srv, free, ext = lab
    with servers(srv, ("10.244.1.6", 80)) as seen:
        judge_with(nft)
        assert connects(ext, "192.168.77.1", 30080)  # positive control: no policy
        # masqueraded: to the gateway's address, which OVS lets through (kubelet probes)
        assert seen[("10.244.1.6", 80)].stdout.readline().strip() == "10.244.1.1"
        judge_with(nft, DENY_INGRESS)
        assert denied(node, "ingress", ext, "192.168.77.1", 30080)  # the external host
        assert denied(node, "ingress", free, "192.168.77.1", 30080)  # a Pod of the same Node
        assert connects(node, "192.168.77.1", 30080)  # the Node itself (its own NodePort)
        from_ext = pol("from-ext", "srv", ["Ingress"], ingress=[{"from": [{"ipBlock": {"cidr": "192.168.77.2/32"}}],
                                                               "ports": [{"port": 80}]}])
        judge_with(nft, DENY_INGRESS, from_ext)
        assert connects(ext, "192.168.77.1", 30080)  # its rule names the client, not the Node
        assert denied(node, "ingress", free, "192.168.77.1", 30080)


def test_the_table_is_written_once_and_removed_with_policy_off(lab: Names, nft: NftApplier) -> None:
    node = lab[0]
    j = hj.render_body(hj.judge(plan(DENY_EGRESS), "ferry-gw0", ["192.168.77.1/24"]))
    assert nft.sync_policy(j) and not nft.sync_policy(j)
    ns_sh(node, "nft", "delete", "table", "inet", POLICY_TABLE)
    assert nft.sync_policy(j)  # deleted by hand: back
    assert nft.sync_policy(None)
    assert POLICY_TABLE not in ns_sh(node, "nft", "list", "tables")
    assert "table inet kp" in ns_sh(node, "nft", "list", "tables")  # another's table untouched


def judge_tiers(nft: NftApplier, policies: tuple[dict, ...], tiers: tuple[dict, ...]) -> None:
    """The judge of NetworkPolicies ``policies`` and ClusterNetworkPolicies ``tiers``."""
    from routesync.policy.cnp import plan as tp
    from routesync.policy.cnp.model import cluster_policy_from

    t = tp.plan(tp.Inputs((CLI, SRV, FREE), NAMESPACES, tuple(cluster_policy_from(d) for d in tiers)),
                tp.Facts("n1"))
    j = hj.judge(plan(*policies), "ferry-gw0", ["10.244.1.1/24", "192.168.77.1/24", "fd00:77::1/64"],
                 ["10.96.0.0/16", "fd00:96::/112"], t)
    nft.sync_policy(hj.render_body(j))


NAMESPACES = {"a": (("kubernetes.io/metadata.name", "a"),), "b": (("kubernetes.io/metadata.name", "b"),)}


def cnp(name: str, tier: str, priority: int, app: str | None, ns: str, **rules: list) -> dict:
    """A ClusterNetworkPolicy whose subject is Pods ``app`` of namespace ``ns`` (None: all of it)."""
    nss = {"matchLabels": {"kubernetes.io/metadata.name": ns}}
    subject = ({"pods": {"namespaceSelector": nss, "podSelector": {"matchLabels": {"app": app}}}} if app
               else {"namespaces": nss})
    return {"metadata": {"name": name}, "spec": {"tier": tier, "priority": priority, "subject": subject, **rules}}


TO_API = [{"networks": ["192.168.77.2/32", "fd00:77::2/128"]}]
FROM_B = [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}]


def test_the_tiers_judge_what_kube_proxy_takes_past_ovs(lab: Names, nft: NftApplier) -> None:
    """Egress after a DNAT and ingress after a masquerade, by the Admin tier before NetworkPolicy
    and the Baseline tier after it, as OVS judges what it sees."""
    node, cli, srv, free, ext = lab
    with servers(ext, ("::", 6443)), servers(srv, ("10.244.1.6", 80)):
        deny_api = cnp("deny-api", "Admin", 10, "cli", "a", egress=[{"action": "Deny", "to": TO_API}])
        judge_tiers(nft, (), (deny_api,))
        assert denied(node, "egress", cli, "10.96.0.1", 443) and denied(node, "egress", cli, "fd00:96::1", 443)
        assert connects(free, "10.96.0.1", 443)  # positive control: not a subject
        # a Pass hands it to NetworkPolicy: its egress isolation denies, its ipBlock rule allows
        pass_api = cnp("pass-api", "Admin", 5, "cli", "a", egress=[{"action": "Pass", "to": TO_API}])
        judge_tiers(nft, (DENY_EGRESS,), (deny_api, pass_api))
        assert denied(node, "egress_np", cli, "10.96.0.1", 443)
        judge_tiers(nft, (DENY_EGRESS, API_ALLOWED), (deny_api, pass_api))
        assert connects(cli, "10.96.0.1", 443)
        # an Admin Accept opens what the NetworkPolicy isolates
        accept_api = cnp("accept-api", "Admin", 1, "cli", "a", egress=[{"action": "Accept", "to": TO_API}])
        judge_tiers(nft, (DENY_EGRESS,), (accept_api,))
        assert connects(cli, "10.96.0.1", 443)
        # Baseline: a Deny for a Pod no NetworkPolicy isolates; one that isolates it decides instead
        base = cnp("base", "Baseline", 0, None, "a", egress=[{"action": "Deny", "to": TO_API}])
        judge_tiers(nft, (), (base,))
        assert denied(node, "egress_baseline", cli, "10.96.0.1", 443)
        judge_tiers(nft, (DENY_EGRESS, API_ALLOWED), (base,))
        assert connects(cli, "10.96.0.1", 443)
        # ingress after a NodePort's masquerade, on the original client: a Pod of namespace b
        no_b = cnp("no-b", "Admin", 0, "srv", "a", ingress=[{"action": "Deny", "from": FROM_B}])
        judge_tiers(nft, (), (no_b,))
        assert denied(node, "ingress", free, "192.168.77.1", 30080)
        assert connects(ext, "192.168.77.1", 30080)  # not a peer of the rule
        base_in = cnp("base-in", "Baseline", 0, "srv", "a", ingress=[{"action": "Deny", "from": FROM_B}])
        judge_tiers(nft, (), (base_in,))
        assert denied(node, "ingress_baseline", free, "192.168.77.1", 30080)
        judge_tiers(nft, (), ())
        assert connects(free, "192.168.77.1", 30080) and connects(cli, "10.96.0.1", 443)


def api_to(cidr: str) -> dict:
    return pol("api", "cli", ["Egress"], egress=[{"to": [{"ipBlock": {"cidr": cidr}}], "ports": [{"port": 6443}]}])


def listing(node: str) -> nftlisting.Listing:
    """The judge as nft lists it: its sets by name and its chains (``tests.support.nftlisting``)."""
    got = nftlisting.table(node, "inet", POLICY_TABLE)
    assert got.sets and got.chains
    return got


def test_a_peer_that_comes_and_goes_changes_the_judge_by_element(lab: Names, nft: NftApplier) -> None:
    """Between full passes a judge whose sets alone moved is changed by element: the drop
    counter keeps counting (a table written again starts at 0), each verdict follows the new
    elements (an address, then a block over it, then another address: intervals that overlap
    are swapped in one transaction), the table lists as the same body written whole would, and
    the next full pass finds nothing to write."""
    node, cli, _srv, _free, ext = lab

    def body(cidr: str) -> NftBody:
        return hj.render_body(hj.judge(plan(DENY_EGRESS, api_to(cidr)), "ferry-gw0",
                                       ["10.244.1.1/24", "192.168.77.1/24", "fd00:77::1/64"],
                                       ["10.96.0.0/16", "fd00:96::/112"]))

    with servers(ext, ("::", 6443)):
        assert nft.sync_policy(body("192.168.77.3/32"))  # a full pass: written whole
        assert denied(node, "egress", cli, "10.96.0.1", 443)
        counted = drops(node, "egress")
        for cidr in ("192.168.77.2/32", "192.168.77.0/24"):
            assert nft.sync_policy(body(cidr), verify=False)
            assert connects(cli, "10.96.0.1", 443)  # the API server's address is a peer now
            assert drops(node, "egress") == counted  # the same table: its counter kept
        assert nft.sync_policy(body("192.168.77.4/32"), verify=False)
        assert denied(node, "egress", cli, "10.96.0.1", 443)
        assert drops(node, "egress") > counted
        changed = listing(node)
        assert not nft.sync_policy(body("192.168.77.4/32"))  # a full pass: what the elements made
        fresh = NftApplier(netns=node)  # knows nothing of the element changes: writes it whole
        try:
            assert fresh.sync_policy(body("192.168.77.4/32"))
        finally:
            fresh.close()
        assert listing(node) == changed
        assert drops(node, "egress") == 0


def table_handle(node: str) -> int:
    """The judge table's handle: a table written whole is a new one (delete and create)."""
    head = ns_sh(node, "nft", "-a", "list", "table", "inet", POLICY_TABLE).splitlines()[0]
    return int(head.split("# handle ")[1])


def test_a_rule_that_comes_and_goes_changes_the_judge_in_place(lab: Names, nft: NftApplier) -> None:
    """Between full passes a policy that adds a rule (its sets, its lines) and then goes again is
    applied in place: the table stays the same one, each verdict follows, and it lists as the
    same body written whole would."""
    node, cli, _srv, _free, ext = lab

    def body(*policies: dict) -> NftBody:
        return hj.render_body(hj.judge(plan(*policies), "ferry-gw0",
                                       ["10.244.1.1/24", "192.168.77.1/24", "fd00:77::1/64"],
                                       ["10.96.0.0/16", "fd00:96::/112"]))

    with servers(ext, ("::", 6443)):
        assert nft.sync_policy(body(DENY_EGRESS))  # a full pass: written whole
        table = table_handle(node)
        assert denied(node, "egress", cli, "10.96.0.1", 443)
        assert nft.sync_policy(body(DENY_EGRESS, API_ALLOWED), verify=False)  # a rule came
        assert table_handle(node) == table
        assert connects(cli, "10.96.0.1", 443)
        came = listing(node)
        assert nft.sync_policy(body(DENY_EGRESS), verify=False)  # and went
        assert table_handle(node) == table
        assert denied(node, "egress", cli, "10.96.0.1", 443)
        fresh = NftApplier(netns=node)
        try:
            assert fresh.sync_policy(body(DENY_EGRESS, API_ALLOWED))  # written whole: a new table
        finally:
            fresh.close()
        assert table_handle(node) != table and listing(node) == came
