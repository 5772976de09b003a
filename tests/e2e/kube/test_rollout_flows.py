"""tests/e2e/kube/rollout.py's rule for the upgrade from v0.1.0: the new tree may add whole peer
groups the release lacked, and nothing else (pure; no root, no cluster)."""

from __future__ import annotations

from tests.e2e.kube.rollout import peer_groups_added

BASE = "cookie=0x1, table=0, priority=1 actions=drop"
PEER = "cookie=0x31779f59f4df251, table=70, priority=200,ip,nw_dst=10.244.1.0/24 actions=output:2"
PEER_RX = "cookie=0x31779f59f4df251, priority=20,ip,in_port=2,nw_src=10.244.1.0/24 actions=goto_table:25"


def test_only_whole_peer_groups_the_release_lacked_may_come() -> None:
    assert peer_groups_added([BASE], [BASE, PEER, PEER_RX]) == sorted([PEER, PEER_RX])
    assert peer_groups_added([BASE, PEER], [BASE, PEER, PEER_RX]) is None  # a group it had, changed
    assert peer_groups_added([BASE, PEER], [BASE]) is None  # a flow gone
    assert peer_groups_added([BASE], [BASE, "cookie=0x1, table=1, priority=1 actions=drop"]) is None  # not a peer's
