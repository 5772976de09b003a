"""route-sync's appliers: each diffs desired plain data against what is installed and applies
only the difference.

* :mod:`.ovs` bridge, gateway and tunnel ports (ovsdbapp), BASE/NODE/PEER flows (OpenFlow
  bundles on a persistent ``cni.ovs.openflow`` session, :mod:`.ofsession`; ovs-ofctl for dumps)
* :mod:`.routes` proto-Ferry host routes, permanent neighbours, addresses, MTU, forwarding
* :mod:`.nft` Ferry's nftables tables (libnftables in-process)
* :mod:`.uplink` the reversible move of the uplink onto the bridge

:class:`NodeAppliers` bundles them behind the daemon's ``Appliers`` protocol
(``routesync.daemon.Appliers``); ``make_appliers(config)`` builds it."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Set as AbstractSet
from itertools import compress
from operator import is_not
from typing import TYPE_CHECKING, Any

from cni.pipeline.modes import NETDEV, PATH_TUNNEL
from cni.pipeline.tables import (
    DENIED_LOG_METER,
    EXT_CONTAINER_ID,
    EXT_IFNAME,
    EXT_IPS,
    EXT_POD_NAME,
    EXT_POD_NAMESPACE,
    GATEWAY_PORT,
    TUNNEL_PORT,
    UPLINK_COOKIE,
    Cookie,
    Owner,
    Table,
    pod_cookie,
)
from routesync.apply.nexthops import NextHops
from routesync.apply.nft import NftApplier
from routesync.apply.ovs import OvsApplier, OvsError
from routesync.apply.pods import NetnsGone, PodMtuApplier, PodSyncReport
from routesync.apply.routes import RouteApplier
from routesync.apply.tnlneigh import TunnelNeighbors, tunnel_endpoints
from routesync.apply.uplink import UplinkMover, recorded_spec
from routesync.model import DesiredState, HostRoute, LocalFacts, PeerPlan, SetChanges, TunnelSpec, UplinkSpec

if TYPE_CHECKING:
    from collections.abc import Collection, Sequence

    from cni.node.nodestate import NodeState
    from cni.ovs.openflow.ofctl import DumpedFlow
    from routesync.config import Config
    from routesync.policy.model import Pod
    from routesync.wireguard.device import WireGuardDevice
    from routesync.wireguard.model import WgSpec

LOG = logging.getLogger(__name__)
TNL_RETRY_INTERVAL = 1.0  # s between retries of unresolved tunnel next hops (each an ARP/ND probe)

__all__ = [
    "NextHops",
    "NftApplier",
    "NodeAppliers",
    "OvsApplier",
    "PodMtuApplier",
    "RouteApplier",
    "TunnelNeighbors",
    "UplinkMover",
    "make_appliers",
]


class NodeAppliers:
    """Everything route-sync installs on one Node. ``netns`` (tests, the lab) runs the netlink
    and nft parts in that namespace; OVS is reached through its sockets wherever it runs."""

    def __init__(self, config: Config, netns: str | None = None) -> None:
        self.config = config
        self.netns = netns
        self.ovs = OvsApplier(config.ovsdb, config.bridge, config.ovs_run_dir)
        self.routes = RouteApplier(GATEWAY_PORT, netns=netns)
        self.nft = NftApplier(netns=netns)
        self.tnl_neigh = TunnelNeighbors(self.routes, config.ovs_run_dir, config.bridge)
        # fast path: next hops and their MACs from the kernel (the daemon resolves through it)
        self.next_hops: NextHops | None = NextHops(self.routes, netns) if config.fast_path else None
        self.state_dir = os.path.dirname(config.state_file) or "."
        self._mover: UplinkMover | None = None
        self._uplink: UplinkSpec | None = None
        self._gateway_mac: str | None = None
        self._gateway_ofport: int | None = None
        self._meter_error = ""  # the denied log's meter could not be made: why (logged once)
        from concurrent.futures import ThreadPoolExecutor

        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferry-apply")
        # ovs-vswitchd pid the Pod flows were replayed for, kept on disk: a route-sync restart is
        # not an ovs-vswitchd restart, and must not replay (the plugin owns the Pods' flows).
        self._replay_mark = os.path.join(self.state_dir, "pod-flows-replayed-for")
        self._replayed_for: int | None = self._read_replay_mark()
        # what the last apply installed completely (None: unknown, the next apply is full)
        self._applied: DesiredState | None = None
        # the last delta's routes and their normalized set (the next delta's "before")
        self._normalized: tuple[set[HostRoute], dict[HostRoute, int]] | None = None
        self._released: set[int] = set()  # cookies of the Pods whose pending block was lifted
        self._tnl_retry_at = 0.0  # monotonic: the next retry of unresolved tunnel next hops
        self.pods = PodMtuApplier(self.ovs.pod_ports, self.ovs.pod_port, self._set_host_mtu,
                                  lock_dir=os.path.join(self.state_dir, "locks"))
        # trafficEncryptionMode wireguard: the Node's device (routesync/wireguard/device.py)
        self.wireguard: WireGuardDevice | None = None
        if config.encrypted:
            from routesync.wireguard.device import WireGuardDevice

            self.wireguard = WireGuardDevice(config.wireguard, self.routes.index,
                                             os.path.dirname(config.log_file) if config.log_file else self.state_dir,
                                             netns=netns)

    def _set_host_mtu(self, name: str, mtu: int) -> bool:
        try:
            return self.routes.set_mtu(name, mtu)
        except LookupError:
            raise NetnsGone(f"host veth {name} is gone") from None

    def sync_pods(self, state: NodeState, full: bool = False) -> PodSyncReport:
        """Running Pods to the per-path MTUs of ``state`` (:mod:`.pods`)."""
        return self.pods.sync(state, full)

    def release_pending(self, pods: Sequence[Pod], full: bool = False) -> int:
        """Lift the pending block (``cni.pipeline.flows.pending_flows``) of every local Pod the
        policy planner has seen with the addresses its OVS port holds: its policy is in force
        now (the daemon calls this after the apply).  A Pod is released once; a full pass
        releases all again (a delete of nothing is harmless).  The number of Pods released."""
        want = {(p.namespace, p.name): frozenset(p.ips) for p in pods}
        cookies: list[Cookie] = []
        for row in self.ovs.pod_ports():
            ids = row["external_ids"]
            key = (ids.get(EXT_POD_NAMESPACE), ids.get(EXT_POD_NAME))
            cid, ifname = ids.get(EXT_CONTAINER_ID), ids.get(EXT_IFNAME)
            ips = want.get(key)  # type: ignore[arg-type]
            if ips is None or not cid or not ifname:
                continue
            have = frozenset(a.split("/")[0] for a in (ids.get(EXT_IPS) or "").split(",") if a)
            if not have or not have <= ips:
                continue  # the API's record of another sandbox of this Pod, or not updated yet
            cookie = pod_cookie(cid, ifname)
            if full or cookie.value not in self._released:
                cookies.append(cookie)
        self.ovs.delete_flows_in(Table.CONNTRACK_STATE, cookies)
        self._released = (set() if full else self._released) | {c.value for c in cookies}
        return len(cookies)

    def restore_host_path(self, uplink: UplinkSpec) -> bool:
        """The uplink's pass-through flows (``routesync.apply.uplink``) alone, when the uplink
        is moved onto the bridge: what the Node's own traffic needs, without a pass (the daemon,
        when it cannot list its source).  Whether any were installed."""
        self.ovs.ensure_bridge(self.config.datapath_type)
        mover = self._mover_for(uplink)
        recorded = mover.load()
        if recorded is not None and recorded.vlan != uplink.vlan:
            # the VLAN last applied (a Node annotation may have set it; the source is not read yet)
            mover = self._mover_for(dataclasses.replace(uplink, vlan=recorded.vlan))
        mover.ensure()
        flows = mover.flows()
        if flows:
            self.ovs.replace_group(UPLINK_COOKIE, flows)
        return bool(flows)

    def retry_tunnel_neighbours(self, now: float | None = None) -> list[tuple[str, str]]:
        """Between passes (the daemon's loop, every ovs-vswitchd look): while a tunnel next hop of
        the last apply is unresolved, probe it again, at most every ``TNL_RETRY_INTERVAL`` s, and
        write it into OVS's cache once the kernel knows it.  What was written."""
        import time

        applied = self._applied
        if (not self.tnl_neigh.unresolved or applied is None or applied.tunnel is None
                or self.config.datapath_type != NETDEV):
            return []
        now = time.monotonic() if now is None else now
        if now < self._tnl_retry_at:
            return []
        self._tnl_retry_at = now + TNL_RETRY_INTERVAL
        return self.tnl_neigh.sync(tunnel_endpoints(applied.peers))

    def policy_flows(self) -> list[DumpedFlow]:
        """The NetworkPolicy flows with their counters (``ovs-ofctl dump-flows``)."""
        from cni.ovs.openflow.ofctl import Ofctl

        return Ofctl(self.config.bridge, self.config.ovs_run_dir).dump_flows(
            f"cookie={Cookie.owner_match(Owner.POLICY)}")

    def _mover_for(self, spec: UplinkSpec) -> UplinkMover:
        if self._mover is None or self._mover.spec != spec:
            if self._mover is not None:
                self._mover.close()
            self._mover = UplinkMover(self.ovs, spec, self.state_dir, self.config.datapath_type,
                                      netns=self.netns, nft=self.nft)
        return self._mover

    def prepare(self, config: Config, tunnel: TunnelSpec | None, uplink: UplinkSpec | None,
                gateway_addresses: tuple[str, ...]) -> LocalFacts:
        self.ovs.ensure_bridge(config.datapath_type)
        meter = config.network_policy and config.denied_log.enabled and self._denied_log_meter(config)
        gw_ofport, gw_mac = self.ovs.ensure_gateway(GATEWAY_PORT)
        self._gateway_mac = gw_mac
        self._gateway_ofport = gw_ofport
        self.routes.set_gateway_addresses(GATEWAY_PORT, gateway_addresses)
        uplink_ofport = host_ofport = None
        moved_mtu = None
        moved = False
        if uplink is not None:
            mover = self._mover_for(uplink)
            before = mover.moves
            st = mover.ensure()
            moved = mover.moves > before
            uplink_ofport = st.ports.get(st.renamed)
            host_ofport = st.ports.get(st.name)
            moved_mtu = st.mtu  # the physical link's, followed by the internal port (ensure)
        else:
            self._restore_uplink(config)
        self._uplink = uplink
        if self.wireguard is not None:  # before any route names it
            self.wireguard.ensure()
        tunnel_ofport = self.ovs.ensure_tunnel(tunnel, None, name=TUNNEL_PORT)
        name = uplink.name if uplink else config.transport_interface
        info = self.routes.link_info(name)
        return LocalFacts(
            gateway_ofport=gw_ofport, gateway_mac=gw_mac, tunnel_ofport=tunnel_ofport,
            uplink_name=name,
            uplink_addresses=tuple(sorted(self.routes.addresses(name))) if info else (),
            transport_mtu=moved_mtu or (info[1] if info else 1500), uplink_mac=info[0] if info else None,
            uplink_ofport=uplink_ofport, uplink_host_ofport=host_ofport, denied_log_meter=meter,
            node_addresses=tuple(sorted(self.routes.node_addresses())) if config.network_policy else (),
            uplink_moved=moved)

    def _denied_log_meter(self, config: Config) -> bool:
        """The denied log's meter made (before any flow uses it); a switch that cannot (a kernel
        datapath without meters) is logged once, and the log is off (no flow sends packets up)."""
        try:
            self.ovs.ensure_meter(DENIED_LOG_METER, *config.denied_log.meter)
        except OvsError as e:
            if str(e) != self._meter_error:
                LOG.warning("NetworkPolicy's denied log off: %s", e)
                self._meter_error = str(e)
            return False
        if self._meter_error:
            LOG.info("NetworkPolicy's denied log on: meter %d made", DENIED_LOG_METER)
            self._meter_error = ""
        return True

    def _restore_uplink(self, config: Config) -> None:
        """A move recorded by an earlier run but no longer wanted is undone."""
        mover = self._mover_for(recorded_spec(config))
        if mover.load() is not None:
            mover.restore()

    def apply(self, desired: DesiredState) -> None:
        """Full (``desired.full``): every part compares with what the system holds.  Otherwise,
        when the last apply succeeded and only per-peer state moved, only the difference from
        that apply is installed (:meth:`apply_delta`)."""
        before, self._applied = self._applied, None
        if not desired.full and before is not None and delta_applicable(before, desired):
            self.apply_delta(before, desired)
        else:
            self.apply_full(desired)
        self._applied = desired

    def apply_delta(self, before: DesiredState, after: DesiredState) -> None:
        """Peer flows by cookie group (one bundle), routes and neighbours by set difference (one
        netlink batch), the nft table only when its plan changed, tunnel neighbours only for new
        endpoints.  Nothing is read back: drift is the next full pass's."""
        nft = None
        if after.nft != before.nft and not self.nft.native:
            # `nft -f` launched (no libnftables): beside the rest, as it touches unrelated state
            nft = self._side.submit(self.nft.sync, after.nft, verify=False)
        try:
            self._apply_delta(before, after)
        finally:
            if nft is not None:
                nft.result()  # its failure is this pass's failure too
        if after.tunnel is not None and self.config.datapath_type == NETDEV and after.peers is not before.peers:
            # the plans that are not the very objects of before's (the planner's memo keeps an
            # unchanged peer's): their endpoints, less those of the plans they replaced
            known = after.peer_changes
            if known is not None and known.since is before.peers:
                new, gone = list(known.added), list(known.removed)
            else:
                new, gone = _replaced(before.peers, after.peers)
            fresh = _endpoints(new) - _endpoints(gone)
            if fresh:
                self.tnl_neigh.sync(tunnel_endpoints(p for p in new if p.transport_address in fresh),
                                    trust_written=True)

    def _apply_delta(self, before: DesiredState, after: DesiredState) -> None:
        if after.wireguard is not None:  # first: a key rotation's switch is on time
            self._apply_wireguard(after.wireguard, before.wireguard, full=False)
        if after.policy_nft != before.policy_nft:  # before the flows: OVS may stop judging what it hands over
            self.nft.sync_policy(after.policy_nft, verify=False)
        self.ovs.sync_flow_delta(before.flows, after.flows)
        self._apply_route_delta(before.routes, after.routes, after.route_changes)
        if _differ(before.neighbors, after.neighbors, after.neighbor_changes):
            self.routes.sync_neighbors(after.neighbors)
        if after.nft != before.nft and self.nft.native:
            # one after the other: each is a round trip of ~1 ms (OpenFlow socket, netlink,
            # libnftables); run side by side, the threads' Python parts made each wait for the
            # GIL (a 5 ms switch interval) and a change took longer
            self.nft.sync(after.nft, verify=False, defer_removals=True)

    def _apply_route_delta(self, before: set[HostRoute], after: set[HostRoute],
                           changes: SetChanges | None = None) -> None:
        """The routes that came and went (the planner's word when it made ``after`` from
        ``before``, else set differences: its memo hands an unchanged peer's routes over as the
        same objects), normalized; a normalized route goes when no desired route normalizes to it
        any more (counted, the counts kept from the last delta)."""
        cached = self._normalized
        self._normalized = None
        counts = cached[1] if cached is not None and cached[0] is before else None
        if counts is None:
            counts = {}
            for n in self.routes.normalized_each(before):
                counts[n] = counts.get(n, 0) + 1
        came: AbstractSet[HostRoute]
        went: AbstractSet[HostRoute]
        if changes is not None and changes.since is before:
            came, went = changes.added, changes.removed
        else:
            came, went = after - before, before - after
        gone: set[HostRoute] = set()
        for n in self.routes.normalized_each(went):
            counts[n] -= 1
            if not counts[n]:
                del counts[n]
                gone.add(n)
        fresh: set[HostRoute] = set()
        for n in self.routes.normalized_each(came):
            counts[n] = counts.get(n, 0) + 1
            if counts[n] == 1:
                fresh.add(n)
        self.routes.apply_routes(sorted(fresh - gone, key=repr), sorted(gone - fresh, key=repr))
        self._normalized = (after, counts)

    def apply_full(self, desired: DesiredState) -> None:
        """OVS (flows, Pod flow replay, MTU request) and nftables here; the kernel's side
        (gateway addresses and MTU, routes, forwarding, the tunnel neighbour cache, all on the
        route applier's sockets) beside it on the side thread: each mostly waits for
        ovs-vswitchd or the kernel, so the two overlap (1,000 peers: flows and routes are the
        two largest parts of a full pass)."""
        kernel = self._side.submit(self._apply_kernel, desired)
        try:
            self.nft.sync_policy(desired.policy_nft)
            extra = self._mover.flows() if (self._mover and self._uplink) else []
            self.ovs.sync_flows(list(desired.flows) + extra)
            self._replay_pod_flows(desired.policy_namespaces)
            if gateway_mtu(desired):
                self.ovs.set_mtu_request(GATEWAY_PORT, gateway_mtu(desired))
            self.nft.sync(desired.nft)
        finally:
            kernel.result()  # waited for also when OVS failed; its failure is this pass's too

    def _apply_wireguard(self, spec: WgSpec, before: WgSpec | None, full: bool) -> None:
        """The device's addresses, MTU and link state (when they changed, or full), then its keys
        and peers (:meth:`WireGuardDevice.sync`)."""
        assert self.wireguard is not None
        name = self.wireguard.name
        if full or before is None or before.addresses != spec.addresses or before.mtu != spec.mtu:
            self.routes.set_mtu(name, spec.mtu)
            self.routes.set_gateway_addresses(name, spec.addresses)  # and the link up
        self.wireguard.sync(spec, full)

    def switch_wireguard(self, spec: WgSpec) -> None:
        """The device alone to ``spec`` (a rotation's instant), against what was applied last."""
        if self.wireguard is not None:
            self.wireguard.sync(spec, full=False)
            if self._applied is not None:
                self._applied = dataclasses.replace(self._applied, wireguard=spec)

    def wireguard_generation(self) -> int:
        return self.wireguard.generation() if self.wireguard is not None else 0

    def rehandshake_wireguard(self, since: float, among: Collection[str] | None = None) -> tuple[str, ...]:
        return self.wireguard.rehandshake(since, among) if self.wireguard is not None else ()

    def kick_wireguard(self, since: float, among: Collection[str]) -> tuple[str, ...]:
        return self.wireguard.kick(since, among) if self.wireguard is not None else ()

    def wireguard_awaited(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        return self.wireguard.take_awaited() if self.wireguard is not None else ()

    def wireguard_implementation(self) -> str | None:
        return self.wireguard.implementation if self.wireguard is not None else None

    def _apply_kernel(self, desired: DesiredState) -> None:
        if desired.wireguard is not None:  # before the routes that name the device
            self._apply_wireguard(desired.wireguard, None, full=True)
        self.routes.set_gateway_addresses(GATEWAY_PORT, desired.gateway_addresses)
        if gateway_mtu(desired):
            self.routes.set_mtu(GATEWAY_PORT, gateway_mtu(desired))
        self.routes.sync(desired.routes, desired.neighbors)
        self.routes.set_forwarding(desired.forwarding, desired.forwarding)
        if desired.tunnel is not None and self.config.datapath_type == NETDEV:
            self.tnl_neigh.sync(tunnel_endpoints(desired.peers))

    def _replay_pod_flows(self, pending_namespaces: tuple[str, ...] = ()) -> None:
        """Once per ovs-vswitchd instance (a restart loses every flow, the plugin's too): put the
        per-Pod flows back from the Pod ports' external_ids.  Not on every reconcile: between the
        plugin's port creation and its flow install (ADD) or flow and port removal (DEL) a Pod's
        flows are legitimately absent."""
        instance = self.ovs.vswitchd_instance()
        if instance is None or instance == self._replayed_for or self._gateway_mac is None:
            return
        self.ovs.replay_pod_flows(self._gateway_mac, self._gateway_ofport,
                                  lock_dir=os.path.join(self.state_dir, "locks"), pending_namespaces=pending_namespaces)
        self._released = set()  # the replayed pending blocks are lifted again for the Pods already planned
        self._replayed_for = instance
        tmp = self._replay_mark + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(instance))
        os.replace(tmp, self._replay_mark)

    def _read_replay_mark(self) -> int | None:
        try:
            with open(self._replay_mark) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def ovs_generation(self) -> int:
        return self.ovs.vswitchd_instance() or 0

    def ovs_restoring(self) -> bool:
        return self.ovs.flow_restore_waiting()

    def teardown(self, config: Config) -> None:
        """Undo everything route-sync installed (the uplink first, so the Node keeps its address)."""
        self._applied = None
        if self._uplink is not None:
            self._mover_for(self._uplink).restore()
        else:
            self._restore_uplink(config)
        self.ovs.sync_flows([])
        self.routes.sync(set(), set())
        self.nft.delete()
        self.ovs.ensure_tunnel(None, None, name=TUNNEL_PORT)
        self.ovs.delete_port(GATEWAY_PORT)
        if self.wireguard is not None:
            self.wireguard.delete()

    def close(self) -> None:
        self._side.shutdown(wait=True)
        if self.next_hops is not None:
            self.next_hops.close()
        if self._mover is not None:
            self._mover.close()
        self.routes.close()
        self.ovs.close()


def delta_applicable(before: DesiredState, after: DesiredState) -> bool:
    """Only per-peer state (flows, routes, neighbours, nft sets, tunnel endpoints) differs: the
    Node-wide settings an apply also makes (gateway addresses, MTU, tunnel, uplink, forwarding)
    are the same."""
    return (before.gateway_addresses == after.gateway_addresses and before.mtu == after.mtu
            and (before.wireguard is None) == (after.wireguard is None)
            and before.transport_mtu == after.transport_mtu
            and before.tunnel == after.tunnel and before.uplink == after.uplink
            and before.forwarding == after.forwarding)


def _differ(before: set[Any], after: set[Any], changes: SetChanges | None) -> bool:
    """Whether ``after`` differs from ``before``: the planner's word when it made one from the
    other, else a comparison of the two."""
    if changes is not None and changes.since is before:
        return bool(changes.added or changes.removed)
    return after != before


def gateway_mtu(desired: DesiredState) -> int:
    """The gateway port carries the full MTU: Pods' packets to routed peers and to non-Pod
    destinations cross it unencapsulated; the Node's own packets to tunnelled peers are held to
    the tunnel MTU by their host routes' MTU."""
    return desired.transport_mtu or desired.mtu


def _replaced(before: list[PeerPlan], after: list[PeerPlan]) -> tuple[list[PeerPlan], list[PeerPlan]]:
    """The plans of ``after`` that are not objects of ``before``, and those of ``before`` gone:
    place by place when both are as long (a peer re-planned in place: C work), else by identity."""
    if len(before) == len(after):
        at = list(compress(range(len(after)), map(is_not, after, before)))
        if len(at) <= 16:
            return [after[i] for i in at], [before[i] for i in at]
    was = dict(zip(map(id, before), before))
    now = dict(zip(map(id, after), after))
    return [now[i] for i in now.keys() - was.keys()], [was[i] for i in was.keys() - now.keys()]


def _endpoints(peers: list[PeerPlan]) -> set[str | None]:
    return {p.transport_address for p in peers if p.path == PATH_TUNNEL}


def make_appliers(config: Config, netns: str | None = None) -> NodeAppliers:
    return NodeAppliers(config, netns=netns)
