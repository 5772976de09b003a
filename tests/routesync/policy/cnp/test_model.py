"""Reading ClusterNetworkPolicy objects: what the API allows, and failing closed on the rest."""

from __future__ import annotations

from typing import Any

import pytest

from routesync.policy.cnp.model import (
    ACCEPT,
    ADMIN,
    BASELINE,
    DENY,
    PASS,
    Port,
    Selection,
    cluster_policy_from,
    node_info_from,
)
from routesync.policy.model import ObjectError
from routesync.policy.selector import EVERYTHING


def cnp(spec: dict[str, Any], name: str = "p") -> dict[str, Any]:
    return {"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": name}, "spec": spec}


NS = {"namespaces": {"matchLabels": {"team": "a"}}}


def test_a_whole_policy_reads_as_written() -> None:
    p = cluster_policy_from(cnp({
        "tier": "Baseline", "priority": 7,
        "subject": {"pods": {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}},
        "ingress": [{"name": "web", "action": "Accept", "from": [NS],
                     "protocols": [{"tcp": {"destinationPort": {"number": 5432}}},
                                   {"udp": {"destinationPort": {"range": {"start": 1000, "end": 2000}}}},
                                   {"sctp": {}}, {"destinationNamedPort": "metrics"}]}],
        "egress": [{"action": "Deny", "to": [{"networks": ["10.0.0.1/8", "fd00::/64"]}, {"nodes": {}}]},
                   {"action": "Pass", "to": [{"domainNames": ["example.org"]}]}]}))
    assert (p.tier, p.priority, p.errors) == (BASELINE, 7, ())
    assert p.subject.pods is not None and p.subject.namespaces == EVERYTHING
    (web,) = p.ingress
    assert (web.name, web.action) == ("web", ACCEPT)
    assert web.ports == (Port("TCP", 5432, 5432), Port("UDP", 1000, 2000), Port("SCTP"), Port(None, name="metrics"))
    deny, pass_ = p.egress
    assert deny.action == DENY and deny.peers is not None
    assert deny.peers[0].networks == ("10.0.0.0/8", "fd00::/64") and deny.peers[1].nodes is not None
    assert pass_.action == PASS and pass_.peers is not None and pass_.peers[0].domain_names == ("example.org",)


@pytest.mark.parametrize("action", ["Deny", "Pass"])
def test_an_unreadable_deny_or_pass_rule_denies_everything(action: str) -> None:
    p = cluster_policy_from(cnp({"tier": "Admin", "priority": 1, "subject": NS,
                                 "ingress": [{"action": action, "from": [{"bogus": {}}]}]}))
    (rule,) = p.ingress
    assert (rule.action, rule.peers, rule.ports) == (DENY, None, None)
    assert "spec.ingress[0].from[0]" in p.errors[0] and "Deny all" in p.errors[0], p.errors


def test_an_unreadable_accept_rule_matches_nothing_and_keeps_its_place() -> None:
    p = cluster_policy_from(cnp({"tier": "Admin", "priority": 1, "subject": NS, "egress": [
        {"action": "Accept", "to": [NS], "protocols": [{"tcp": {"destinationPort": {"number": 0}}}]},
        {"action": "Deny", "to": [NS]}]}))
    first, second = p.egress
    assert first.action == ACCEPT and first.peers == ()
    assert second.action == DENY and second.peers is not None
    assert "protocols[0].tcp.destinationPort.number" in p.errors[0] and "matches nothing" in p.errors[0]


def test_an_unknown_action_or_tier_fails_closed() -> None:
    p = cluster_policy_from(cnp({"tier": "Platform", "priority": 5000, "subject": NS,
                                 "ingress": [{"action": "Allow", "from": [NS]}]}))
    assert p.tier == ADMIN and p.priority == 1000
    assert (p.ingress[0].action, p.ingress[0].peers) == (DENY, None)
    assert any("spec.tier" in e for e in p.errors) and any("spec.priority" in e for e in p.errors)
    assert any("action: 'Allow'" in e for e in p.errors)


def test_an_unreadable_subject_selects_every_pod() -> None:
    p = cluster_policy_from(cnp({"tier": "Admin", "priority": 0, "subject": {"namespaces": {}, "pods": {}}}))
    assert p.subject == Selection(EVERYTHING) and "subject" in p.errors[0]


def test_ingress_takes_no_networks_peer_and_a_port_range_is_ordered() -> None:
    p = cluster_policy_from(cnp({"tier": "Admin", "priority": 0, "subject": NS, "ingress": [
        {"action": "Accept", "from": [{"networks": ["10.0.0.0/8"]}]},
        {"action": "Accept", "from": [NS], "protocols": [{"tcp": {"destinationPort": {"range": {"start": 9,
                                                                                                 "end": 8}}}}]}]}))
    assert [r.peers for r in p.ingress] == [(), ()]
    assert "from[0]" in p.errors[0] and "networks" in p.errors[0]
    assert "end 8 before start 9" in p.errors[1]


def test_a_nameless_object_is_refused_and_nodes_read_their_ips() -> None:
    with pytest.raises(ObjectError, match="metadata.name"):
        cluster_policy_from({"spec": {}})
    n = node_info_from({"metadata": {"name": "n1", "labels": {"zone": "z"}},
                        "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.1"},
                                                 {"type": "Hostname", "address": "n1"},
                                                 {"type": "InternalIP", "address": "2001:db8::1"}]}})
    assert (n.labels, n.addresses) == ((("zone", "z"),), ("192.0.2.1", "2001:db8::1"))
