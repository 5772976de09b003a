"""A Node change is planned as a delta (issue 40): the planner's memo re-plans the peers that
changed and its flows name the cookie groups that moved (``routesync.flowdelta``), the state
file's text keeps the unchanged peers' parts (``routesync.statefile.Encoder``).  The full planner
(no memo) stays the reference: random Node event sequences (added, removed, address, subnet, Pod
CIDR, MAC changed, CIDRs claimed twice, duplicated and reordered events) are replayed through
both, and after every step the incremental result equals the full one: the desired state, the
flows an applier following the deltas would hold, and the state file's text.  Half the sequences
hand the planner its peers as the Kubernetes source and the daemon do (``SortedRecords`` ->
``OwnSplit``: lists that say what changed, now and then one no pass planned); the others as
plain lists in any order."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from cni.pipeline.tables import Flow
from routesync.apply.nft import Collapsed, _collapse, cluster_sets, inet_sets
from routesync.apply.ovs import _group
from routesync.config import Config, from_dict
from routesync.flowdelta import tail_changes
from routesync.model import MAC_ANNOTATION, DesiredState, LocalFacts, NextHop, NodeRecord
from routesync.planner import PeerMemo, node_state, plan
from routesync.recordlist import OwnSplit, own_and_peers
from routesync.sources.sortedrecords import SortedRecords
from routesync.statefile import Encoder

FACTS = LocalFacts(gateway_ofport=2, gateway_mac="02:00:00:00:01:01", tunnel_ofport=3, uplink_name="eth0",
                   uplink_addresses=("192.168.77.11/24", "fd00:77::11/64"), transport_mtu=1500,
                   uplink_mac="02:00:00:00:00:11", uplink_ofport=5)
LOCAL = NodeRecord("node-a", ("192.168.77.11", "fd00:77::11"), ("10.244.1.0/24", "fd00:10:244:1::/64"))
CONFIGS = (
    {"trafficEncapMode": "encap"},
    {"trafficEncapMode": "hybrid"},
    {"trafficEncapMode": "noEncap"},
    {"trafficEncapMode": "noEncap", "fastPath": True, "macSource": "annotation"},
    {"trafficEncapMode": "hybrid", "fastPath": True, "macSource": "both"},
)
# random sequences per configuration and steps (1-3 events each) per sequence: over the
# configurations at least 10,000 events (issue 40's bar)
SEQUENCES, STEPS = 12, 110
HOPS = {f"192.168.77.{20 + i}": NextHop(f"192.168.77.{20 + i}", f"02:00:00:00:02:{i:02x}") for i in range(16)}


def config(extra: dict[str, Any]) -> Config:
    return from_dict({"nodeName": "node-a", "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"], **extra})


def random_record(rnd: random.Random, name: str) -> NodeRecord:
    """A Node with any mix of: an address in this Node's subnet or another, of either family or
    none; a Pod CIDR per family, from a small pool (so two Nodes claim one now and then); a MAC
    annotation or not (valid or not)."""
    addrs: list[str] = []
    if rnd.random() < 0.9:
        addrs.append(f"192.168.{rnd.choice((77, 77, 78))}.{20 + rnd.randrange(16)}")
    if rnd.random() < 0.3:
        addrs.append(f"fd00:{rnd.choice((77, 78))}::{20 + rnd.randrange(16):x}")
    cidrs = [f"10.244.{rnd.randrange(2, 40)}.0/{rnd.choice((24, 24, 24, 23, 25))}"]
    if rnd.random() < 0.4:
        cidrs.append(f"fd00:10:244:{rnd.randrange(2, 40):x}::/64")
    annotations: tuple[tuple[str, str], ...] = ()
    if rnd.random() < 0.5:
        annotations = ((MAC_ANNOTATION, rnd.choice((f"02:00:00:00:03:{rnd.randrange(256):02x}", "not-a-mac"))),)
    return NodeRecord(name, tuple(addrs), tuple(cidrs), annotations)


def event(rnd: random.Random, nodes: dict[str, NodeRecord]) -> str:
    """One Node event on ``nodes`` (name -> record), in place; what it was."""
    names = sorted(nodes)
    kind = rnd.choice(("add", "remove", "address", "cidr", "mac", "subnet", "duplicate", "whole"))
    if kind == "add" or not names:
        name = f"node-{rnd.randrange(60):02d}"
        nodes[name] = random_record(rnd, name)
        return "add"
    name = rnd.choice(names)
    old = nodes[name]
    if kind == "remove":
        del nodes[name]
    elif kind == "address":
        nodes[name] = replace(old, transport_addresses=random_record(rnd, name).transport_addresses)
    elif kind == "subnet":  # the same host, another subnet
        nodes[name] = replace(old, transport_addresses=tuple(
            a.replace("192.168.77.", "192.168.78.") if "192.168.77." in a else a.replace("192.168.78.", "192.168.77.")
            for a in old.transport_addresses))
    elif kind == "cidr":
        nodes[name] = replace(old, pod_cidrs=random_record(rnd, name).pod_cidrs)
    elif kind == "mac":
        nodes[name] = replace(old, annotations=random_record(rnd, name).annotations)
    elif kind == "duplicate":  # the same record again, as a new object
        nodes[name] = replace(old)
    else:
        nodes[name] = random_record(rnd, name)
    return kind


def follow(groups: dict[int, tuple[Flow, ...]] | None, before: list[Flow] | None, after: list[Flow]
           ) -> tuple[dict[int, tuple[Flow, ...]], set[int]]:
    """What an applier following ``after``'s deltas holds (grouped by cookie), and the cookie
    groups it wrote; without a delta to follow, ``after`` grouped whole (every group written)."""
    joined = tail_changes(before, after) if before is not None else None
    if groups is None or joined is None:
        new = _group(after)
        return new, set(new)
    old_head, head, tails = joined
    gone = _group(old_head)
    out = {c: g for c, g in groups.items() if c not in gone}
    out.update(_group(head))
    wrote: set[int] = set()
    for _, changed in tails:
        for c, (was, now) in changed.items():
            assert was == groups.get(c, ()), f"cookie {c:#x}: the delta's 'before' is not what was installed"
            wrote.add(c)
            if now:
                out[c] = now
            else:
                out.pop(c, None)
    return out, wrote


def same_state(a: DesiredState, b: DesiredState) -> None:
    assert a.peers == b.peers
    assert list(a.flows) == list(b.flows)
    assert a.routes == b.routes and a.neighbors == b.neighbors
    assert a.nft == b.nft
    assert a.cidr_conflicts == b.cidr_conflicts and a.mac_disagreements == b.mac_disagreements


def replay(seed: int, extra: dict[str, Any], steps: int) -> int:
    """One random sequence; returns how many events it replayed."""
    rnd = random.Random(seed)
    cfg = config(extra)
    memo = PeerMemo()
    rows: dict[int, Any] = {}
    encoder = Encoder()
    nodes: dict[str, NodeRecord] = {}
    for _ in range(rnd.randrange(0, 12)):
        event(rnd, nodes)
    groups: dict[int, tuple[Flow, ...]] | None = None
    before: list[Flow] | None = None
    events = 0
    clusters: dict[int, Collapsed] | None = None
    last_nft = None
    last_plans: list[Any] | None = None
    last_routes: set[Any] | None = None
    last_neighbors: set[Any] | None = None
    # the Kubernetes source's way: its sorted records, handed out as lists that say what changed,
    # this Node's record (there, as the API server has it) split out by the daemon's OwnSplit
    source = SortedRecords([LOCAL]) if seed % 2 else None
    split, held = OwnSplit(), dict[str, NodeRecord]()
    for step in range(steps):
        what = [event(rnd, nodes) for _ in range(rnd.choice((1, 1, 1, 2, 3)))]  # a burst is one pass
        events += len(what)
        peers: Sequence[NodeRecord]
        if source is not None:
            moved: dict[str, NodeRecord | None] = {n: r for n, r in nodes.items() if held.get(n) is not r}
            moved.update((n, None) for n in held.keys() - nodes.keys())
            source.change(moved)
            held = dict(nodes)
            if rnd.random() < 0.1:
                source.list()  # listed by a pass that failed before it planned
            own, peers = split.split(source.list(), LOCAL.name)
            assert own is LOCAL
        else:
            peers = list(nodes.values())  # a record replaced in place, a new one last
            if rnd.random() < 0.3:
                peers = rnd.sample(peers, len(peers))  # the source's order is no order
            if rnd.random() < 0.1:  # this Node's own record among them
                peers = list(peers)
                peers.insert(rnd.randrange(len(peers) + 1), LOCAL)
        where = f"seed {seed}, step {step}: {what}"
        full = plan(cfg, LOCAL, peers, FACTS, HOPS)
        inc = plan(cfg, LOCAL, peers, FACTS, HOPS, memo=memo)
        same_state(inc, full)
        groups, wrote = follow(groups, before, inc.flows)
        now = _group(inc.flows)  # equal to the full plan's (same_state), and cheaper to compare
        assert groups == now, where
        if before is not None:
            assert tail_changes(before, inc.flows) is not None, f"{where}: the peers' flows did not follow"
            # only the groups that differ are written: the changed Nodes' own flows, nothing else
            was = _group(before)
            assert wrote == {c for c in was.keys() | now.keys() if was.get(c) != now.get(c)}, where
        before = inc.flows
        # the nft cluster sets, changed by the CIDRs that came and went (as the nft applier does)
        if clusters is None:
            clusters = cluster_sets(inc.nft)
        else:
            old, new = set(last_nft.cluster_pod_cidrs), set(inc.nft.cluster_pod_cidrs)
            said = inc.nft.cluster_changes  # the planner's word on what came and went
            assert said is not None and said.since is last_nft.cluster_pod_cidrs, where
            assert (sorted(said.added), sorted(said.removed)) == (sorted(new - old), sorted(old - new)), where
            # the same content is the very tuple: the nft applier (which skips an equal plan) and the
            # Pod inputs trust the planner's word only against the tuple they last had
            if inc.nft.cluster_pod_cidrs == last_nft.cluster_pod_cidrs:
                assert inc.nft.cluster_pod_cidrs is last_nft.cluster_pod_cidrs, where
            for v in (4, 6):
                clusters[v].update(said.added, said.removed)
        last_nft = inc.nft
        # the plans that came and went, as the planner says, against comparing the lists by identity
        if last_plans is not None:
            said_plans = inc.peer_changes
            assert said_plans is not None and said_plans.since is last_plans, where
            was_ids, now_ids = {id(p) for p in last_plans}, {id(p) for p in inc.peers}
            got_in, got_out = {id(p) for p in said_plans.added}, {id(p) for p in said_plans.removed}
            assert (got_in, got_out) == (now_ids - was_ids, was_ids - now_ids), where
        last_plans = inc.peers
        # the routes and neighbours that came and went, as the planner says, against the set
        # differences the route applier would take without its word
        if last_routes is not None:
            for said_set, was_set, now_set in ((inc.route_changes, last_routes, inc.routes),
                                              (inc.neighbor_changes, last_neighbors, inc.neighbors)):
                assert said_set is not None and said_set.since is was_set, where
                assert (said_set.added, said_set.removed) == (now_set - was_set, was_set - now_set), where
        last_routes, last_neighbors = inc.routes, inc.neighbors
        want = inet_sets(full.nft)
        assert [clusters[v].elements() for v in (4, 6)] == [want["cluster4"][1], want["cluster6"][1]], where
        state = node_state(cfg, LOCAL, inc, FACTS, rows)
        assert inc.peer_rows is not None and inc.peer_texts is not None and state.peers is inc.peer_rows
        encoder.give(state.peers, inc.peer_texts)  # as routesync.statefile.StateFile.state does
        text = encoder.encode(state)
        assert text == node_state(cfg, LOCAL, full, FACTS).to_json(), where
    return events


@pytest.mark.parametrize("extra", CONFIGS, ids=lambda e: "-".join(str(v) for v in e.values()))
def test_incremental_equals_the_full_planner_over_random_node_events(extra: dict[str, Any]) -> None:
    events = sum(replay(seed, extra, STEPS) for seed in range(SEQUENCES))
    assert events >= 10_000 // len(CONFIGS)


def test_a_node_change_hands_over_only_its_own_cookie_group() -> None:
    cfg = config({"trafficEncapMode": "encap"})
    memo = PeerMemo()
    peers = [NodeRecord(f"node-{i:03d}", (f"192.168.78.{i}",), (f"10.244.{i}.0/24",)) for i in range(2, 200)]
    first = plan(cfg, LOCAL, peers, FACTS, memo=memo)
    moved = replace(peers[50], pod_cidrs=("10.244.250.0/24",))
    second = plan(cfg, LOCAL, [*peers[:50], moved, *peers[51:]], FACTS, memo=memo)
    joined = tail_changes(first.flows, second.flows)
    assert joined is not None
    (tail, changed), = joined[2]
    cookie = next(f.cookie.value for f in second.flows if "10.244.250.0" in f.text())
    assert list(changed) == [cookie] and tail.groups == len(peers)
    was, now = changed[cookie]
    assert any("10.244.52.0" in f.text() for f in was) and all("10.244.52.0" not in f.text() for f in now)
    third = plan(cfg, LOCAL, [*peers[:50], moved, *peers[51:]], FACTS, memo=memo)  # nothing moved
    again = tail_changes(second.flows, third.flows)
    assert again is not None and again[2][0][1] == {}


def test_collapsed_sets_follow_cidrs_coming_and_going() -> None:
    """:class:`Collapsed` against a collapse from scratch, after every change of a random
    multiset of CIDRs (nested, adjacent, duplicated, both families)."""
    rnd = random.Random(40)
    for _ in range(60):
        have: list[str] = []
        sets = {v: Collapsed(have, v) for v in (4, 6)}
        for _ in range(80):
            if have and rnd.random() < 0.45:
                gone = [have.pop(rnd.randrange(len(have))) for _ in range(rnd.randint(1, min(3, len(have))))]
                added: list[str] = []
            else:
                gone = []
                added = [rnd.choice((
                    f"10.{rnd.randrange(4)}.{rnd.randrange(8)}.0/{rnd.choice((16, 22, 23, 24, 24, 25))}",
                    f"10.0.0.0/{rnd.choice((8, 14))}",
                    f"fd00:{rnd.randrange(4):x}:{rnd.randrange(4):x}::/{rnd.choice((48, 63, 64, 64))}",
                )) for _ in range(rnd.randint(1, 3))]
                have += added
            for v in (4, 6):
                sets[v].update(added, gone)
                assert sets[v].elements() == Collapsed(have, v).elements() == _collapse(have, v), (v, have)


def test_own_and_peers_splits_the_source_s_list_as_a_pass_over_it_did() -> None:
    a, b, c = (NodeRecord(n, (), ()) for n in ("node-a", "node-b", "node-c"))
    again = NodeRecord("node-a", ("192.168.77.1",), ())
    assert own_and_peers([b, a, c], "node-a") == (a, [b, c])
    assert own_and_peers([b, c], "node-a") == (None, [b, c])
    assert own_and_peers([a, b, again, c], "node-a") == (a, [b, c])  # the first of its name; none in the peers
