"""The reversible move of the uplink onto the integration bridge.

Why: OVS userspace tunnels (``datapath_type=netdev``) only work when the tunnel endpoint
address sits on an OVS internal port of the bridge that holds the uplink
(docs/design/decisions.md, "The fast path on the userspace datapath").

Decision: the uplink goes onto ``br-int`` itself, not onto a separate ``br-phy`` joined by
patch ports.  One bridge means one flow pipeline that sees the uplink, the tunnel port, the
gateway and the Pods together: the fast path (a later issue) outputs a Pod's packet straight to
the uplink in one table lookup, received tunnel and underlay traffic needs no patch-port hop,
and there is one OVS instance state to restore.  The cost is that host traffic crosses
br-int's Classifier; two NODE flows (cookie ``UPLINK_COOKIE``, low priority) pass it between
the physical link and the internal port, below anything the fast path adds.

Steps (``move``), each idempotent, with the original recorded in ``<state_dir>/uplink.json``
before anything changes:

1. record name, ifindex, MAC, MTU, global addresses and routes (all tables except local,
   not ``proto kernel``) of the uplink;
2. rename ``eth0`` → ``eth0~`` (live rename; down/rename/up on kernels that refuse it);
3. attach ``eth0~`` to the bridge, create internal port ``eth0`` with the uplink's MAC and MTU;
4. install the pass-through flows;
5. addresses and routes onto the internal port, then off the physical link;
6. on netdev, drop at ``eth0~``'s ingress (the kernel must not also process what OVS read).

``restore`` undoes it in the opposite order (addresses back on the physical link before the
internal port goes away, so the Node keeps an address throughout) and deletes the state file.
``repair`` (at start) continues whatever the state file says was in progress: a half-done move
is completed, a half-done restore finished.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from cni.kernel.netlink import RT_TABLE_LOCAL, RTNH_F_ONLINK, RTPROT_KERNEL, Link, Netlink, NetlinkError
from cni.pipeline.actions import output, tagged_output
from cni.pipeline.match import IN_PORT
from cni.pipeline.modes import NETDEV
from cni.pipeline.tables import UPLINK_COOKIE, Classifier, Flow, Table
from routesync.apply.nft import NftApplier
from routesync.apply.ovs import OvsApplier
from routesync.model import UplinkSpec
from routesync.peerflows import tagged_in, untag
from routesync.planner import uplink_renamed

if TYPE_CHECKING:
    from cni.pipeline.modes import Datapath
    from routesync.config import Config

LOG = logging.getLogger(__name__)

STATE_VERSION = 1
OVS_KINDS = ("tun", "openvswitch")  # an OVS internal port: tap (netdev) or openvswitch (system)


class UplinkError(RuntimeError):
    pass


@dataclass
class RouteRecord:
    family: int
    dst: str  # CIDR
    gateway: str | None
    table: int
    proto: int
    scope: int
    type: int
    priority: int | None
    prefsrc: str | None
    onlink: bool


@dataclass
class UplinkState:
    name: str
    renamed: str
    bridge: str
    ifindex: int
    mac: str
    mtu: int
    addresses: list[str]
    routes: list[RouteRecord]
    phase: str = "moving"  # moving | moved | restoring
    version: int = STATE_VERSION
    ports: dict[str, int] = field(default_factory=dict)
    vlan: int | None = None  # the transport VLAN the pass-through flows were last installed with
    # the physical link's net.ipv6.conf.<dev>.disable_ipv6 before a VLAN turned it off ("0"/"1"),
    # None: never touched
    ipv6_was: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> UplinkState:
        raw = json.loads(text)
        if raw.get("version") != STATE_VERSION:
            raise UplinkError(f"uplink state version {raw.get('version')} unknown")
        raw["routes"] = [RouteRecord(**r) for r in raw["routes"]]
        return UplinkState(**raw)


def uplink_flows(physical_ofport: int, internal_ofport: int, vlan: int | None = None) -> list[Flow]:
    """Host traffic between the physical uplink and the internal port that took its name.  With
    a transport VLAN, what the internal port sends leaves tagged with it, and only frames tagged
    with it come in (their tag popped): an untagged frame from the uplink (another network, the
    trunk's native VLAN) reaches nothing, it misses the Classifier and is dropped."""
    return [
        Flow(Table.CLASSIFIER, Classifier.UPLINK_PASS, (IN_PORT(physical_ofport), *tagged_in(vlan)),
             (*untag(vlan), output(internal_ofport)), UPLINK_COOKIE),
        Flow(Table.CLASSIFIER, Classifier.UPLINK_PASS, (IN_PORT(internal_ofport),),
             tagged_output(physical_ofport, vlan), UPLINK_COOKIE),
    ]


class UplinkMover:
    """Moves ``spec.name`` onto ``ovs``'s bridge and back; state in ``state_dir/uplink.json``."""

    def __init__(self, ovs: OvsApplier, spec: UplinkSpec, state_dir: str,
                 datapath_type: Datapath = NETDEV, netns: str | None = None,
                 nft: NftApplier | None = None) -> None:
        self.ovs = ovs
        self.spec = spec
        self.state_path = os.path.join(state_dir, "uplink.json")
        self.datapath_type = datapath_type
        self.netns = netns
        self.nft = nft or NftApplier(netns=netns)
        self.nl = Netlink.in_netns(f"/run/netns/{netns}") if netns else Netlink()
        self.moves = 0  # moves done by this process (the Node's connections opened before one stall)
        # test hook: called with each step's name after it completed (a test raises to "crash")
        self.after_step: Callable[[str], None] = lambda step: None

    def close(self) -> None:
        self.nl.close()

    # -- state file
    def load(self) -> UplinkState | None:
        try:
            with open(self.state_path) as f:
                return UplinkState.from_json(f.read())
        except FileNotFoundError:
            return None

    def _save(self, state: UplinkState) -> None:
        d = os.path.dirname(self.state_path) or "."
        os.makedirs(d, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".uplink.")
        with os.fdopen(fd, "w") as f:
            f.write(state.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    # -- kernel view
    def _link(self, ref: str | int) -> Link | None:
        return self.nl.link_get(ref)

    @staticmethod
    def _kind(link: Link) -> str | None:
        return link.kind

    def _addresses(self, index: int) -> list[str]:
        return sorted(c for c in self.nl.addrs(index) if not ipaddress.ip_interface(c).ip.is_link_local)

    def _routes(self, index: int) -> list[RouteRecord]:
        out = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for r in self.nl.routes(family, index, table=None):  # every table, unicast only
                if r.table == RT_TABLE_LOCAL or r.proto == RTPROT_KERNEL:
                    continue
                out.append(RouteRecord(
                    family=family, dst=r.dst, gateway=r.gw, table=r.table, proto=r.proto, scope=r.scope,
                    type=1, priority=r.metric, prefsrc=r.prefsrc, onlink=bool(r.flags & RTNH_F_ONLINK)))
        return sorted(out, key=lambda x: (x.family, x.gateway is not None, x.dst))

    def snapshot(self, name: str) -> dict[str, Any]:
        """Name, MAC, MTU, addresses and routes of ``name`` (what restore must give back)."""
        link = self._link(name)
        if link is None:
            raise UplinkError(f"no link {name!r}")
        return {"name": link.name, "mac": link.mac, "mtu": link.mtu, "addresses": self._addresses(link.index),
                "routes": [asdict(r) for r in self._routes(link.index)], "up": link.up}

    def _record(self) -> UplinkState:
        link = self._link(self.spec.name)
        if link is None:
            raise UplinkError(f"uplink {self.spec.name!r} not found")
        if self._kind(link) in OVS_KINDS:
            raise UplinkError(f"{self.spec.name!r} is already an OVS internal port, but no "
                              f"state file {self.state_path} says how it got there")
        idx = link.index
        return UplinkState(name=self.spec.name, renamed=self.spec.renamed, bridge=self.ovs.bridge,
                           ifindex=idx, mac=link.mac, mtu=link.mtu, addresses=self._addresses(idx),
                           routes=self._routes(idx))

    def _physical(self, st: UplinkState) -> Link:
        link = self._link(st.ifindex)
        if link is not None and link.name in (st.name, st.renamed) \
                and self._kind(link) not in OVS_KINDS:
            return link
        for name in (st.renamed, st.name):
            link = self._link(name)
            if link is not None and self._kind(link) not in OVS_KINDS:
                return link
        raise UplinkError(f"the physical uplink ({st.name}/{st.renamed}) is gone")

    def _rename(self, index: int, new: str) -> None:
        try:
            self.nl.link_set(index, name=new)
        except NetlinkError as e:
            if e.errno != errno.EBUSY:
                raise
            self.nl.link_set(index, up=False)  # kernels without live rename
            self.nl.link_set(index, name=new)
            self.nl.link_set(index, up=True)

    def _wait_link(self, name: str, timeout: float = 10.0) -> Link:
        deadline = time.monotonic() + timeout
        while True:
            link = self._link(name)
            if link is not None and self._kind(link) in OVS_KINDS:
                return link
            if time.monotonic() > deadline:
                raise UplinkError(f"internal port {name} did not appear in the kernel")
            time.sleep(0.01)

    def _put_addresses(self, index: int, cidrs: list[str]) -> None:
        have = set(self._addresses(index))
        for c in cidrs:
            if c in have:
                continue
            self.nl.addr_add(index, c, nodad=True)  # IPv6 without DAD

    def _drop_addresses(self, index: int, cidrs: list[str]) -> None:
        have = set(self._addresses(index))
        for c in cidrs:
            if c in have:
                self.nl.addr_del(index, c)

    def _put_routes(self, index: int, routes: list[RouteRecord]) -> None:
        for r in routes:  # unicast (what _routes records)
            self.nl.route_add(r.dst, r.gateway, index, onlink=r.onlink, table=r.table, proto=r.proto,
                              metric=r.priority, replace=True, scope=r.scope, prefsrc=r.prefsrc)

    # -- the move
    def move(self) -> UplinkState:
        """Move (or finish moving) the uplink onto the bridge; idempotent."""
        st = self.load()
        if st is None:
            st = self._record()
            self._save(st)  # BEFORE changing anything
            self.after_step("recorded")
        if st.phase == "restoring":
            raise UplinkError("a restore is in progress; run repair() first")
        st.phase = "moving"
        self._save(st)
        phys = self._physical(st)
        idx = phys.index
        if phys.name != st.renamed:
            self._rename(idx, st.renamed)
        self.nl.link_set(idx, up=True)
        self.after_step("renamed")
        of_phys = self.ovs.attach_port(st.renamed)
        of_int = self.ovs.ensure_internal_port(st.name, mac=st.mac, mtu=st.mtu)
        st.ports = {st.renamed: of_phys, st.name: of_int}
        st.vlan = self.spec.vlan
        self._save(st)
        internal = self._wait_link(st.name)
        self.after_step("attached")
        self.ovs.replace_group(UPLINK_COOKIE, uplink_flows(of_phys, of_int, st.vlan))
        self.after_step("flows")
        iidx = internal.index
        self.nl.link_set(iidx, up=True)
        self._put_addresses(iidx, st.addresses)
        self._put_routes(iidx, st.routes)
        self.after_step("addressed")
        self._drop_addresses(idx, st.addresses)
        self.after_step("unaddressed")
        if self.datapath_type == NETDEV:
            self.nft.set_uplink_drop(st.renamed)
        self._quiet_physical(st)
        st.phase = "moved"
        self._save(st)
        self.after_step("moved")
        self.moves += 1
        LOG.info("uplink %s moved onto %s (physical now %s)", st.name, st.bridge, st.renamed)
        return st

    def ensure(self) -> UplinkState:
        """Cheap check for every reconcile: do nothing when the recorded move is complete and
        the links look as it left them; otherwise (first run, crash, drift) ``move``."""
        st = self.load()
        if st is not None and st.phase == "moved" and st.ports:
            internal, phys = self._link(st.name), self._link(st.renamed)
            if internal is not None and self._kind(internal) in OVS_KINDS and phys is not None:
                if st.vlan != self.spec.vlan:  # the pass installs the flows with it (flows())
                    LOG.info("uplink %s: transport VLAN %s -> %s (None: untagged)", st.name, st.vlan, self.spec.vlan)
                    st.vlan = self.spec.vlan
                    self._save(st)
                self._quiet_physical(st)  # also when something turned it back on (a read of /proc)
                return self._follow_mtu(st, phys)
        if st is not None and st.phase == "restoring":
            self.restore()
        return self.move()

    def _sysctl(self, key: str, value: str | None = None) -> str:
        """Read (or write) ``key`` (``net/ipv6/conf/eth0~/disable_ipv6``) in the Node's namespace."""
        if self.netns is None:
            path = f"/proc/sys/{key}"
            if value is not None:
                with open(path, "w") as f:
                    f.write(value)
            with open(path) as f:
                return f.read().strip()
        argv = ["ip", "netns", "exec", self.netns, "sysctl", "-n"]
        if value is not None:
            subprocess.run([*argv[:-1], "-q", "-w", f"{key}={value}"], check=True)
        return subprocess.run([*argv, key], check=True, capture_output=True, text=True).stdout.strip()

    def _quiet_physical(self, st: UplinkState) -> None:
        """With a transport VLAN the Node's kernel must send nothing itself out of the physical
        link: it would leave untagged, onto the trunk's native VLAN (IPv6 link-local chatter: MLD
        reports, router solicitations).  Its IPv6 goes off there (the internal port keeps the
        Node's IPv6); the value before is recorded for restore."""
        if st.vlan is None:
            return
        key = f"net/ipv6/conf/{st.renamed}/disable_ipv6"
        try:
            was = self._sysctl(key)
            if st.ipv6_was is None:
                st.ipv6_was = was
                self._save(st)
            if was != "1":
                self._sysctl(key, "1")
        except (OSError, ValueError, subprocess.CalledProcessError) as e:  # no IPv6 here: nothing to quiet
            LOG.debug("uplink %s: %s not set: %s", st.renamed, key, e)

    def _follow_mtu(self, st: UplinkState, phys: Link) -> UplinkState:
        """The underlay's MTU is the physical link's: an operator who changes it (say 1500 ->
        9000 on the segment and the uplinks) changes ``eth0~``; the internal port follows, and
        the recorded MTU too, so that a restore keeps what the operator set."""
        mtu = phys.mtu
        if mtu and mtu != st.mtu:
            LOG.info("uplink %s: physical MTU %s -> %s, the internal port follows", st.renamed, st.mtu, mtu)
            st.mtu = mtu
            self._save(st)
        self.ovs.set_mtu_request(st.name, st.mtu)
        return st

    def flows(self) -> list[Flow]:
        """The pass-through flows while moved (the daemon adds them to its desired flows)."""
        st = self.load()
        if st is None or st.phase != "moved" or not st.ports:
            return []
        return uplink_flows(st.ports[st.renamed], st.ports[st.name], self.spec.vlan)

    def restore(self) -> bool:
        """Give the original link back its name, MAC, MTU, addresses and routes; idempotent.
        Returns False when nothing was moved."""
        st = self.load()
        if st is None:
            return False
        st.phase = "restoring"
        self._save(st)
        phys = self._physical(st)
        idx = phys.index
        if st.ipv6_was is not None and st.ipv6_was != "1":  # IPv6 back on it (_quiet_physical) before its addresses
            try:
                self._sysctl(f"net/ipv6/conf/{phys.name}/disable_ipv6", st.ipv6_was)
            except (OSError, ValueError, subprocess.CalledProcessError) as e:
                LOG.warning("uplink %s: IPv6 not turned back on: %s", phys.name, e)
        self.nft.set_uplink_drop(None)
        self.after_step("undropped")
        self.nl.link_set(idx, up=True)
        self._put_addresses(idx, st.addresses)
        self._put_routes(idx, st.routes)
        self.after_step("readdressed")
        internal = self._link(st.name)
        if internal is not None and self._kind(internal) in OVS_KINDS:
            # off the internal port before its flows go, so replies leave by the physical link
            self._drop_addresses(internal.index, st.addresses)
        self.ovs.delete_flows(UPLINK_COOKIE)
        api = self.ovs.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.del_port(st.name, bridge=st.bridge, if_exists=True))
            txn.add(api.del_port(st.renamed, bridge=st.bridge, if_exists=True))
        self.after_step("detached")
        deadline = time.monotonic() + 10
        while (lk := self._link(st.name)) is not None and self._kind(lk) in OVS_KINDS:
            if time.monotonic() > deadline:
                raise UplinkError(f"internal port {st.name} still exists")
            time.sleep(0.01)
        if phys.name != st.name:
            self._rename(idx, st.name)
        link = self._link(idx)
        if link is None:
            raise UplinkError(f"the physical uplink (index {idx}) vanished during restore")
        if link.mtu != st.mtu:
            self.nl.link_set(idx, mtu=st.mtu)
        if link.mac != st.mac:
            self.nl.link_set(idx, mac=st.mac)
        self._put_routes(idx, st.routes)  # routes that went with the internal port's removal
        os.unlink(self.state_path)
        LOG.info("uplink %s restored", st.name)
        return True

    def repair(self) -> str:
        """At start: finish what the state file says was in progress. Returns what it did."""
        st = self.load()
        if st is None:
            return "nothing"
        if st.phase == "restoring":
            self.restore()
            return "restored"
        self.move()
        return "moved" if st.phase == "moving" else "checked"


def recorded_spec(config: Config) -> UplinkSpec:
    """The uplink a move of ``config.transport_interface`` renames (the spec a restore needs)."""
    name = config.transport_interface
    return UplinkSpec(name, uplink_renamed(name))


def restore_recorded(config: Config) -> bool:
    """Undo a move recorded in route-sync's state directory, whoever runs it: route-sync when
    the uplink is no longer wanted on the bridge, Ferry's openvswitch container before it stops
    the daemons (without ovs-vswitchd a Node whose address lives on the bridge's internal port
    is cut off, and its kubelet could not even report the Ferry Pod gone, so the new one would
    never come).  False when nothing was moved."""
    ovs = OvsApplier(config.ovsdb, config.bridge, config.ovs_run_dir)
    mover = UplinkMover(ovs, recorded_spec(config), os.path.dirname(config.state_file) or ".",
                        config.datapath_type)
    try:
        return mover.load() is not None and mover.restore()
    finally:
        mover.close()
        ovs.close()
