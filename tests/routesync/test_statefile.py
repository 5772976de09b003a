"""routesync.statefile.StateFile: which passes write the node state file at once and which leave
it pending for the loop's flush (no root: a file in a temporary directory)."""

from __future__ import annotations

from pathlib import Path

from cni.lean.record import replace
from cni.node import nodestate
from routesync.config import Config
from routesync.statefile import STATE_IDLE, StateFile


def state(peers: int, namespaces: tuple[str, ...] = (), mtu: int = 1450) -> nodestate.NodeState:
    rows = [nodestate.Peer(name=f"node-{n}", addresses=[f"192.168.77.{n}"], podCIDRs=[f"10.244.{n}.0/24"],
                           path="tunnel") for n in range(2, 2 + peers)]
    return nodestate.NodeState(
        node="node-1", mode="encap", bridge="br-int", datapath="netdev", ovsdb="unix:x", ovsRunDir="/r",
        mtu=mtu, podCIDRs=["10.244.1.0/24"], clusterCIDRs=["10.244.0.0/16", *(r.podCIDRs[0] for r in rows)],
        gateway=nodestate.Gateway("ferry-gw0", "02:00:00:00:00:01", 2, ["10.244.1.1/24"]),
        peers=rows, transportMTU=1500, policyNamespaces=list(namespaces))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rows_wait_for_the_flush_what_an_add_reads_is_written_at_once(tmp_path: Path) -> None:
    path = tmp_path / "node-state.json"
    clock = Clock()
    sf = StateFile(Config(node_name="node-1", state_file=str(path)), clock)
    assert sf.write(state(3), full=True)
    assert len(nodestate.read(str(path)).peers) == 3 and sf.flush_at() is None

    # a Node joined: only the rows and the cluster's CIDRs moved -> pending, the file as it was
    assert sf.write(state(4), full=False)
    assert len(nodestate.read(str(path)).peers) == 3
    assert sf.flush_at() == clock.now + STATE_IDLE
    clock.now += 0.05
    assert sf.write(state(5), full=False)  # a burst: one write at its end
    sf.flush()
    assert len(nodestate.read(str(path)).peers) == 5 and sf.flush_at() is None

    # a namespace got a NetworkPolicy: an ADD there must start pending now, not after the burst
    assert sf.write(state(6, namespaces=("shop",)), full=False)
    got = nodestate.read(str(path))
    assert got.policyNamespaces == ["shop"] and len(got.peers) == 6 and sf.flush_at() is None

    # the MTU moved with the rows: written at once too
    assert sf.write(state(7, namespaces=("shop",), mtu=1400), full=False)
    assert nodestate.read(str(path)).mtu == 1400

    # a full pass writes whatever changed
    assert sf.write(state(8, namespaces=("shop",), mtu=1400), full=True)
    assert len(nodestate.read(str(path)).peers) == 8
    assert not sf.write(replace(state(8, namespaces=("shop",), mtu=1400)), full=True)  # the same: nothing
