"""The host's judge (routesync.policy.hostjudge) as text: which Pods and rules it holds, and that
nft takes it.  Its verdicts on real NATed traffic: tests/routesync/apply/test_host_judge.py."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from routesync.policy import hostjudge as hj
from routesync.policy import plan as pp
from routesync.policy.model import Pod, policy_from

NODE = "n1"
CLI = Pod("a", "cli", NODE, (("app", "cli"),), ("10.244.1.5", "fd00:244:1::5"))
SRV = Pod("a", "srv", NODE, (("app", "srv"),), ("10.244.1.6",))
FREE = Pod("b", "free", NODE, (), ("10.244.1.7",))
FAR = Pod("a", "far", "n2", (("app", "far"),), ("10.244.2.6",))


def pol(name: str, app: str, types: list[str], ingress: list | None = None, egress: list | None = None) -> dict:
    spec: dict = {"podSelector": {"matchLabels": {"app": app}}, "policyTypes": types}
    if ingress is not None:
        spec["ingress"] = ingress
    if egress is not None:
        spec["egress"] = egress
    return {"metadata": {"namespace": "a", "name": name}, "spec": spec}


EGRESS = pol("eg", "cli", ["Egress"], egress=[
    {"to": [{"ipBlock": {"cidr": "192.168.0.0/16", "except": ["192.168.1.0/24"]}}],
     "ports": [{"port": 443}, {"port": 8000, "endPort": 8100}, {"protocol": "UDP"}]},
    {"to": [{"podSelector": {"matchLabels": {"app": "far"}}}]}])
INGRESS = pol("in", "srv", ["Ingress"], ingress=[{"from": [{"podSelector": {"matchLabels": {"app": "far"}}}],
                                                  "ports": [{"port": 80}]}])


def judge(policies: list[dict], pods: tuple[Pod, ...] = (CLI, SRV, FREE, FAR)) -> hj.HostJudge:
    plan = pp.plan(pp.Inputs(pods, {"a": (), "b": ()}, tuple(policy_from(d) for d in policies)),
                   pp.NodeFacts(NODE))
    return hj.judge(plan, "ferry-gw0", ["10.244.1.1/24", "192.168.77.11/24", "fd00:77::11/64"],
                    ["10.96.0.0/16", "fd00:96::/112"])


def test_only_isolated_local_pods_are_judged() -> None:
    j = judge([EGRESS, INGRESS])
    assert j.egress_isolated == ("10.244.1.5", "fd00:244:1::5")
    assert j.ingress_isolated == ("10.244.1.6",)
    assert j.node_addresses == ("10.244.1.1", "192.168.77.11", "fd00:77::11")
    body = hj.render(j)
    assert "set egress4 { type ipv4_addr; elements = { 10.244.1.5 } }" in body
    assert "10.244.1.7" not in body  # a Pod without policy: returned by the set lookup
    assert "10.244.2.6" in body  # a remote Pod as a peer


def test_rules_by_family_protocol_and_port() -> None:
    lines = hj.render(judge([EGRESS, INGRESS])).splitlines()
    accepts = [line.strip() for line in lines if "accept comment" in line]
    eg = [a for a in accepts if a.startswith(("ip saddr", "ip6 saddr"))]
    # rule 1: ports 443 and 8000-8100 of TCP in one match, UDP by protocol; IPv4 only (its block)
    assert any("tcp dport { 443, 8000-8100 }" in a for a in eg)
    assert any("meta l4proto udp" in a for a in eg)
    assert not any(a.startswith("ip6") and "dport" in a for a in eg)
    # the ingress rule judges the original client (before kube-proxy's masquerade)
    ing = [a for a in accepts if a.startswith("ip daddr")]
    assert len(ing) == 1 and "ct original ip saddr @r" in ing[0] and "tcp dport { 80 }" in ing[0]


def test_no_policy_no_rules_and_the_chains_stay() -> None:
    body = hj.render(judge([]))
    assert "accept comment" not in body
    assert "set egress4 { type ipv4_addr; }" in body
    for hook in ("hook input", "hook forward", "hook postrouting priority srcnat + 10"):
        assert hook in body
    assert 'oifname != "ferry-gw0" jump egress' in body  # what re-enters OVS is judged there


def test_a_rule_that_allows_nothing_of_a_family_has_no_line_for_it() -> None:
    v6only = pol("v6", "cli", ["Egress"], egress=[{"to": [{"ipBlock": {"cidr": "fd00:1::/64"}}]}])
    accepts = [line for line in hj.render(judge([v6only])).splitlines() if "accept comment" in line]
    assert len(accepts) == 1 and "ip6 saddr" in accepts[0]


def test_a_bad_gateway_name_is_refused() -> None:
    j = judge([])
    with pytest.raises(ValueError, match="device name"):
        hj.render(hj.HostJudge('gw"0', (), (), (), ()))
    assert hj.render(j)


@pytest.mark.root
def test_nft_takes_it() -> None:
    body = hj.render(judge([EGRESS, INGRESS]))
    proc = subprocess.run(["nft", "-c", "-f", "-"], input=f"table inet ferry_policy {{\n{body}}}\n",
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_the_tiers_go_around_networkpolicy_in_precedence_order() -> None:
    """ClusterNetworkPolicy's local rules: Admin lines first (a Pass goes to NetworkPolicy's chain),
    NetworkPolicy's (a Pod it does not isolate goes on to Baseline), Baseline's (a Pass accepts);
    a remote subject is not the host's: OVS judges it where its packets are."""
    from routesync.policy.cnp import plan as tp
    from routesync.policy.cnp.model import cluster_policy_from

    sub = {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cli"}}}}
    far = {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "far"}}}}
    docs = [{"metadata": {"name": n}, "spec": {"tier": t, "priority": p, "subject": sub, "egress": [
        {"action": a, "to": [{"networks": ["192.0.2.0/24"]}]}]}}
        for n, t, p, a in (("late", "Admin", 9, "Deny"), ("early", "Admin", 1, "Pass"),
                           ("base", "Baseline", 0, "Pass"))]
    docs.append({"metadata": {"name": "remote"}, "spec": {"tier": "Admin", "priority": 0, "subject": far,
                                                            "egress": [{"action": "Deny", "to": [far]}]}})
    t = tp.plan(tp.Inputs((CLI, SRV, FREE, FAR), {"a": (), "b": ()}, tuple(cluster_policy_from(d) for d in docs)),
                tp.Facts(NODE))
    plan = pp.plan(pp.Inputs((CLI, SRV, FREE, FAR), {"a": (), "b": ()}, ()), pp.NodeFacts(NODE))
    text = hj.render(hj.judge(plan, "ferry-gw0", ["192.168.77.1/24"], (), t))
    egress = text.split("chain egress {")[1].split("}")[0]
    ids = {r.policy: r.conj_id for r in t.rules}
    assert [ln.strip().split(" comment")[0].rsplit(" ", 2)[-2:] for ln in egress.splitlines() if "@t" in ln] == [
        ["goto", "egress_np"], ["counter", "drop"]]  # early's Pass, then late's Deny (IPv4 only)
    assert egress.index(f"rule {ids['early']}") < egress.index(f"rule {ids['late']}")
    assert egress.strip().splitlines()[-1].strip() == "goto egress_np"
    np_chain = text.split("chain egress_np {")[1].split("}")[0]
    assert "ip saddr != @egress4 goto egress_baseline" in np_chain
    baseline = text.split("chain egress_baseline {")[1].split("}")[0]
    assert f'accept comment "Baseline rule {ids["base"]}"' in baseline
    assert f"t{ids['remote']}a4" not in text  # far is another Node's


def test_a_memo_renders_the_same_text_as_it_moves() -> None:
    """route-sync renders again with what the last render kept (``RenderMemo``): each text is
    the one a render without it gives, whatever moved in between."""
    memo = hj.RenderMemo()
    far2 = Pod("a", "far2", "n2", (("app", "far"),), ("10.244.2.3", "fd00:244:2::3"))
    for policies, pods in (([EGRESS, INGRESS], (CLI, SRV, FREE, FAR)),
                           ([EGRESS, INGRESS], (CLI, SRV, FREE, FAR, far2)),  # a peer more
                           ([INGRESS], (CLI, SRV, FREE, FAR, far2)),
                           ([EGRESS, INGRESS], (CLI, SRV, FREE, FAR))):
        j = judge(policies, pods)
        assert hj.render(j, memo) == hj.render(j)
    assert len(memo.rules) == len(j.rules)  # only the last render's rules are kept


@pytest.mark.root
def test_overlapping_peers_collapse_and_nft_takes_them() -> None:
    """A rule's peers that overlap -- a nodes peer's address beside ``networks: [0.0.0.0/0]`` (the
    conformance suite's node-peer Deny), an ipBlock beside a selector's Pods -- are one interval
    set, which nft refuses whole when its elements overlap ("conflicting intervals specified"):
    they collapse into the block."""
    from routesync.policy.cnp import plan as tp
    from routesync.policy.cnp.model import NodeInfo, cluster_policy_from

    sub = {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "cli"}}}}
    deny = {"metadata": {"name": "nodes-and-world"}, "spec": {"tier": "Admin", "priority": 75, "subject": sub,
                                                              "egress": [{"action": "Deny", "to": [
                                                                  {"nodes": {"matchLabels": {"os": "linux"}}},
                                                                  {"networks": ["0.0.0.0/0", "::/0"]}]}]}}
    nodes = (NodeInfo("n1", (("os", "linux"),), ("192.168.77.11", "fd00:77::11")),)
    t = tp.plan(tp.Inputs((CLI, SRV, FREE, FAR), {"a": (), "b": ()}, (cluster_policy_from(deny),), nodes),
                tp.Facts(NODE))
    wide = pol("wide", "cli", ["Egress"], egress=[{"to": [{"ipBlock": {"cidr": "10.244.0.0/16"}},
                                                          {"podSelector": {"matchLabels": {"app": "far"}}}]}])
    plan = pp.plan(pp.Inputs((CLI, SRV, FREE, FAR), {"a": (), "b": ()}, (policy_from(wide),)), pp.NodeFacts(NODE))
    body = hj.render(hj.judge(plan, "ferry-gw0", ["192.168.77.1/24"], (), t))
    assert "elements = { 0.0.0.0/0 }" in body and "elements = { ::/0 }" in body, body
    assert "elements = { 10.244.0.0/16 }" in body, body
    assert "192.168.77.11" not in body.split("chain")[0] and "10.244.2.6" not in body.split("chain")[0]
    proc = subprocess.run(["nft", "-c", "-f", "-"], input=f"table inet ferry_policy {{\n{body}}}\n",
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@given(st.lists(st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), min_size=1, max_size=30, unique=True))
def test_the_isolated_pods_addresses_in_ipaddress_order(addrs: list) -> None:
    """The judge's own order (packed bytes) is ``ipaddress``'s: IPv4 first, then by value."""
    pods = tuple(Pod("a", f"p{i}", NODE, (("app", "cli"),), (str(a),)) for i, a in enumerate(addrs))
    j = judge([pol("eg", "cli", ["Egress", "Ingress"], egress=[], ingress=[])], pods)
    want = tuple(str(a) for a in sorted(addrs, key=lambda a: (a.version, a)))
    assert j.egress_isolated == j.ingress_isolated == want
