"""OVS applier: bridge, gateway port, tunnel port (ovsdbapp) and route-sync's flows.

Flows are synced per cookie group: the desired flows of owners BASE/NODE/PEER are grouped by
cookie and compared, in OVS's own canonical text (``ovs-ofctl parse-flows`` renders the desired
flows exactly as ``dump-flows`` prints the installed ones), with what is installed.  Groups that
differ are replaced (delete by cookie + add) and stale groups deleted, all in one OpenFlow
bundle, so a peer's flows change atomically and a second sync with the same input sends nothing.
POD-owned flows are never selected, compared or deleted.

Bundles go over route-sync's persistent OpenFlow connection (:mod:`.ofsession`, no exec),
encoded from the flows' typed values (:mod:`cni.ovs.openflow.codec`); only a first pass's large
bundle goes through ``ovs-ofctl --bundle add-flows`` (its C parser runs beside this process).
Dumps and canonical text stay ``ovs-ofctl``'s (full passes only); a group not installed at all
needs no canonical text (it is added), so a first start parses nothing and the cache is filled in
the background for the next full pass.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

from cni.ovs.openflow.codec import OpenFlowError
from cni.ovs.openflow.ofctl import DEFAULT_PRIORITY, DumpedFlow, parse_dump
from cni.pipeline.modes import GRE, NETDEV, SYSTEM, TUNNEL_TYPES
from cni.pipeline.tables import (
    EXT_CHAINED_GATEWAYS,
    EXT_GATEWAY_MAC,
    EXT_OWNER,
    FULL_MASK,
    GATEWAY_PORT,
    OWNER_NODE,
    OWNER_POD,
    OWNER_SHIFT,
    Cookie,
    Flow,
    Owner,
)
from routesync.apply.ofsession import OpenFlowSession
from routesync.flowdelta import Changed, TrackedFlows, tail_changes
from routesync.model import TunnelSpec

if TYPE_CHECKING:
    from cni.pipeline.modes import Datapath

LOG = logging.getLogger(__name__)

SYNCED_OWNERS = frozenset({Owner.BASE, Owner.NODE, Owner.PEER, Owner.POLICY})
OF_VERSION = "OpenFlow13"
# The plugin's ofctl speaks OpenFlow13; OpenFlow10 stays enabled for plain `ovs-ofctl` users.
BRIDGE_PROTOCOLS = ["OpenFlow10", "OpenFlow13"]
# A bundle with more flows than this that were never encoded (a first full pass: 2 per peer)
# goes through ovs-ofctl: its C parser runs in a process of its own, beside this one's Python
# (routes on the side thread), while encoding thousands here competes with them for the GIL
# (5,000 peers: full pass ~4.2-6.0 s native vs ~3.9-4.1 s before, same load).
NATIVE_MAX_FRESH = 256


class OvsError(RuntimeError):
    """An OVSDB transaction or ovs-ofctl call failed."""


@dataclass
class FlowDiff:
    """What one sync did: cookies replaced (changed or missing), added, deleted, left alone."""

    added: list[int] = field(default_factory=list)  # group newly installed
    replaced: list[int] = field(default_factory=list)  # group existed with other flows
    deleted: list[int] = field(default_factory=list)  # group no longer desired
    unchanged: int = 0
    flows_sent: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.replaced or self.deleted)


# ---------------------------------------------------------------- pure helpers (no system access)

def _priority_match(text: str) -> tuple[int, str]:
    """``priority=200,ip,nw_dst=...`` → (200, "ip,nw_dst=..."); OVS omits the default priority."""
    if text.startswith("priority="):
        head, _, rest = text.partition(",")
        return int(head.split("=", 1)[1]), rest
    return DEFAULT_PRIORITY, text


def parse_flow_mods(text: str) -> list[tuple[int, int, int, str, str]]:
    """Parse ``ovs-ofctl parse-flows`` output: (cookie, table, priority, match, actions) per ADD."""
    out = []
    for line in text.splitlines():
        if "OFPT_FLOW_MOD" not in line or "): ADD" not in line:
            continue
        body = line.split("): ADD", 1)[1].strip()
        table = 0
        if body.startswith("table:"):
            head, _, body = body.partition(" ")
            table = int(head.split(":", 1)[1])
        left, _, actions = body.partition(" actions=")
        words = left.split(" ")
        cookie = next((int(w.split(":", 1)[1], 16) for w in words if w.startswith("cookie:")), 0)
        match_part = "" if words[0].startswith("cookie:") else words[0]
        priority, match = _priority_match(match_part)
        out.append((cookie, table, priority, match, actions))
    return out


def owner_of(cookie: int) -> Owner | None:
    try:
        return Owner(cookie >> OWNER_SHIFT)
    except ValueError:
        return None


def group_installed(flows: Iterable[DumpedFlow]) -> dict[int, list[DumpedFlow]]:
    """Installed flows of route-sync's owners, grouped by cookie (POD and foreign cookies dropped)."""
    groups: dict[int, list[DumpedFlow]] = defaultdict(list)
    for f in flows:
        if owner_of(f.cookie) in SYNCED_OWNERS:
            groups[f.cookie].append(f)
    return dict(groups)


def plan_flow_sync(desired: Mapping[int, frozenset[Any]], installed: Mapping[int, frozenset[Any]]
                   ) -> tuple[list[int], list[int], list[int], int]:
    """(add, replace, delete, unchanged) cookie lists from flow sets per cookie (canonical flow
    tuples against a dump, or flow texts against what was installed last)."""
    add = sorted(c for c in desired if c not in installed)
    replace = sorted(c for c in desired if c in installed and installed[c] != desired[c])
    delete = sorted(c for c in installed if c not in desired)
    unchanged = sum(1 for c in desired if c in installed and installed[c] == desired[c])
    return add, replace, delete, unchanged


def bundle_text(add: Iterable[int], replace: Iterable[int], delete: Iterable[int],
                flows_by_cookie: dict[int, list[Flow]]) -> str:
    """The flow-mod file sent with ``--bundle add-flows``: delete + add share one cookie match."""
    lines = []
    for c in delete:
        lines.append(f"delete cookie=0x{c:x}/0x{FULL_MASK:x}")
    for c in replace:
        lines.append(f"delete cookie=0x{c:x}/0x{FULL_MASK:x}")
    for c in list(replace) + list(add):
        lines.extend(f"add {f.text()}" for f in flows_by_cookie[c])
    return "\n".join(lines) + ("\n" if lines else "")


def pod_flow_groups(ports: Iterable[dict[str, Any]], gateway_mac: str,
                    gateway_ofport: int | None = None, pending_namespaces: frozenset[str] = frozenset()
                    ) -> dict[int, list[Flow]]:
    """Per-Pod flows by cookie value, rebuilt from Pod ports' external_ids (``cni.pipeline.tables.EXT_*``:
    container id, ifname, ips, mac) exactly as the plugin's ADD built them (with the pending
    block for a Pod of ``pending_namespaces``).  Ports without an ofport or with incomplete ids
    are skipped."""
    from cni.pipeline.flows import PodPort, pending_flows, pod_flows
    from cni.pipeline.tables import (
        EXT_CONTAINER_ID,
        EXT_IFNAME,
        EXT_IPS,
        EXT_MAC,
        EXT_POD_NAMESPACE,
        pod_cookie,
    )

    out: dict[int, list[Flow]] = {}
    for p in ports:
        ids = p.get("external_ids") or {}
        cid, ifname, mac, ips = (ids.get(EXT_CONTAINER_ID), ids.get(EXT_IFNAME), ids.get(EXT_MAC),
                                 ids.get(EXT_IPS))
        ofport = p.get("ofport") or -1
        if not (cid and ifname and mac and ips) or ofport <= 0:
            continue
        cookie = pod_cookie(cid, ifname)
        addrs = tuple(a.strip() for a in ips.split(",") if a.strip())
        out[cookie.value] = pod_flows(PodPort(cookie, int(ofport), mac, addrs),  # type: ignore[call-arg]
                                      gateway_mac, gateway_ofport)
        if ids.get(EXT_POD_NAMESPACE) in pending_namespaces:
            out[cookie.value] += pending_flows(cookie, addrs)
        gateways = ids.get(EXT_CHAINED_GATEWAYS)  # a chained (networkPolicyOnly) Pod's next hops
        if gateways:
            from cni.pipeline.chained import next_hop_flows

            out[cookie.value] += next_hop_flows(cookie, int(ofport),
                                                tuple(g for g in gateways.split(",") if g), gateway_mac)
    return out


def _group(flows: Iterable[Flow]) -> dict[int, tuple[Flow, ...]]:
    """Flows by cookie value, in their order.  A planner emits a peer's flows one after the
    other under one Cookie object: runs of the same object are grouped without asking each
    flow's cookie for its value (1,000 peers: a few ms less per Node change)."""
    groups: dict[int, list[Flow]] = {}
    run: list[Flow] = []
    cookie: Cookie | None = None
    for f in flows:
        if f.cookie is not cookie:
            if run:
                groups.setdefault(run[0].cookie.value, []).extend(run)
            cookie, run = f.cookie, [f]
        else:
            run.append(f)
    if run:
        groups.setdefault(run[0].cookie.value, []).extend(run)
    return {c: tuple(g) for c, g in groups.items()}


def _compare(old: Mapping[int, tuple[Flow, ...]], new: Mapping[int, tuple[Flow, ...]]
             ) -> tuple[list[int], list[int], list[int], int]:
    """Cookie groups to add, replace and delete to go from ``old`` to ``new``, and how many are
    unchanged: the very same flows, or the same texts; every cookie route-sync's."""
    for c in new:
        if owner_of(c) not in SYNCED_OWNERS:
            raise ValueError(f"route-sync does not own cookie {c:#x} ({new[c][0].text()})")
    add, replace, unchanged = [], [], 0
    for c, flows in new.items():
        was = old.get(c)
        if was is None:
            add.append(c)
        elif was == flows or {f.text() for f in was} == {f.text() for f in flows}:
            unchanged += 1
        else:
            replace.append(c)
    return add, replace, [c for c in old if c not in new], unchanged


def stable_mac(seed: str) -> str:
    """A locally administered unicast MAC derived from ``seed`` (02:xx:..)."""
    d = hashlib.sha256(seed.encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in d[:5])


def tunnel_options(spec: TunnelSpec, local_ip: str | None) -> dict[str, str]:
    if spec.type not in TUNNEL_TYPES:
        raise ValueError(f"tunnel type {spec.type!r} is not one of {TUNNEL_TYPES}")
    opts = {"remote_ip": "flow", "key": "flow"}
    if spec.dst_port is not None and spec.type != GRE:
        opts["dst_port"] = str(spec.dst_port)
    if local_ip:
        opts["local_ip"] = local_ip
    return opts


# ---------------------------------------------------------------- the applier

class OvsApplier:
    """Bridge, ports and flows of route-sync on one bridge.

    ``ovsdb`` is an OVSDB remote (``unix:/run/openvswitch/db.sock``); ``run_dir`` holds
    ``<bridge>.mgmt`` (ovs-ofctl's target) and ``ovs-vswitchd.pid`` (restart detection).
    One persistent ovsdbapp connection per applier (its own API class, since ovsdbapp keeps the
    connection in a class attribute and several Nodes may live in one test process)."""

    def __init__(self, ovsdb: str, bridge: str, run_dir: str, timeout: float = 10.0) -> None:
        self.ovsdb = ovsdb
        self.bridge = bridge
        self.run_dir = run_dir
        self.timeout = timeout
        self._api: Any = None
        self._conn: Any = None
        self._canon_cache: dict[str, tuple[int, int, int, str, str]] = {}
        self._canon_warm: threading.Thread | None = None
        self.session = OpenFlowSession(bridge, run_dir, timeout)
        # the flow list the last sync installed and its groups (the next delta starts from it)
        # the flows the last sync installed, grouped by cookie; True: their head's only
        # (routesync.flowdelta: the tracked tail is followed by its changes)
        self._last: tuple[list[Flow], dict[int, tuple[Flow, ...]], bool] | None = None
        self.native_bundles = self.ofctl_bundles = 0  # how bundles went (tests, metrics)
        self.flow_mods = 0  # flow-mods sent (deletes by cookie and adds), replays included
        self._meters: dict[int, tuple[int | None, int, int]] = {}  # id -> (vswitchd instance, rate, burst) made

    # -- connection
    @property
    def api(self) -> Any:
        if self._api is None:
            from ovsdbapp.backend.ovs_idl import connection, idlutils
            from ovsdbapp.schema.open_vswitch import impl_idl

            helper = idlutils.get_schema_helper(self.ovsdb, "Open_vSwitch")
            helper.register_all()
            self._conn = connection.Connection(connection.OvsdbIdl(self.ovsdb, helper), self.timeout)
            api_cls = type("FerryOvsdb", (impl_idl.OvsdbIdl,), {"_ovsdb_connection": None})
            self._api = api_cls(self._conn)
        return self._api

    def close(self) -> None:
        self.session.close()
        if self._conn is not None:
            self._conn.stop(timeout=2)
        self._api = self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, table: str, record: str, column: str) -> Any:
        return self.api.db_get(table, record, column).execute(check_error=True)

    # -- bridge and ports
    def ensure_bridge(self, datapath_type: Datapath = NETDEV) -> None:
        """Bridge with fail_mode=secure (no NORMAL fallback) and the protocols ofctl needs."""
        api = self.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_br(self.bridge, may_exist=True, datapath_type=datapath_type))
            txn.add(api.db_set("Bridge", self.bridge, ("fail_mode", "secure"),
                               ("protocols", BRIDGE_PROTOCOLS),
                               ("datapath_type", datapath_type)))
        self._wait_mgmt(datapath_type)

    def _wait_mgmt(self, datapath_type: Datapath) -> None:
        path = os.path.join(self.run_dir, f"{self.bridge}.mgmt")
        deadline = time.monotonic() + self.timeout
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise OvsError(self._not_opened(datapath_type, path))
            time.sleep(0.01)

    def _not_opened(self, datapath_type: Datapath, path: str) -> str:
        """Why the bridge has no OpenFlow socket: ovs-vswitchd fills the bridge's
        ``datapath_version`` once it has opened its datapath, and a ``system`` datapath cannot be
        opened without the kernel's openvswitch module (ovs-vswitchd logs "failed to open datapath
        of type system"); the operator's key is route-sync's ``datapathType``."""
        try:
            opened = bool(self._get("Bridge", self.bridge, "datapath_version"))
        except Exception as e:  # noqa: BLE001 - the database gone too (any ovsdbapp error): say what is known
            LOG.info("bridge %s: datapath_version unreadable: %s", self.bridge, e)
            opened = True
        if opened:
            return f"{path} did not appear within {self.timeout:.0f} s"
        hint = (": the kernel's openvswitch module is not loaded? (netdev runs without it)"
                if datapath_type == SYSTEM else "")
        return (f"bridge {self.bridge}: ovs-vswitchd did not open its datapath of type {datapath_type} "
                f"(datapathType) within {self.timeout:.0f} s{hint}; see ovs-vswitchd's log")

    def ofport(self, iface: str) -> int:
        """The ofport OVS assigned to ``iface`` (waits until it is assigned)."""
        deadline = time.monotonic() + self.timeout
        while True:
            rows = self.api.db_find("Interface", ("name", "=", iface),
                                    columns=["ofport", "error"]).execute(check_error=True)
            if rows:
                of = rows[0]["ofport"]
                if isinstance(of, list):
                    of = of[0] if of else -1
                if of and of > 0:
                    return int(of)
                if rows[0].get("error"):
                    raise OvsError(f"interface {iface}: {rows[0]['error']}")
            if time.monotonic() > deadline:
                raise OvsError(f"interface {iface} got no ofport")
            time.sleep(0.01)

    def ensure_internal_port(self, name: str, mac: str | None = None, mtu: int | None = None,
                             owner: str = OWNER_NODE, extra_ids: dict[str, str] | None = None) -> int:
        api = self.api
        ids = {EXT_OWNER: owner, **(extra_ids or {})}
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_port(self.bridge, name, may_exist=True))
            attrs: list[tuple[str, Any]] = [("type", "internal"), ("external_ids", ids)]
            if mac:
                attrs.append(("mac", mac))
            if mtu:
                attrs.append(("mtu_request", mtu))
            txn.add(api.db_set("Interface", name, *attrs))
        return self.ofport(name)

    def ensure_gateway(self, name: str = GATEWAY_PORT, mtu: int | None = None) -> tuple[int, str]:
        """Internal port ``name`` with a stable locally administered MAC (kept in external_ids so a
        restart, or a re-created port, gets the same one).  Returns (ofport, mac)."""
        rows = self.api.db_find("Interface", ("name", "=", name),
                                columns=["external_ids"]).execute(check_error=True)
        mac = None
        if rows:
            mac = rows[0]["external_ids"].get(EXT_GATEWAY_MAC)
        if not mac:
            mac = stable_mac(f"{self.bridge}/{name}/{os.urandom(8).hex()}")
        ofport = self.ensure_internal_port(name, mac=mac, mtu=mtu,
                                           extra_ids={EXT_GATEWAY_MAC: mac})
        return ofport, mac

    def ensure_tunnel(self, spec: TunnelSpec | None, local_ip: str | None = None,
                      name: str | None = None) -> int | None:
        """One flow-based tunnel port; removed when ``spec`` is None; replaced on type change."""
        from cni.pipeline.tables import TUNNEL_PORT

        port = spec.port_name if spec else (name or TUNNEL_PORT)
        rows = self.api.db_find("Interface", ("name", "=", port),
                                columns=["type", "options"]).execute(check_error=True)
        if spec is None:
            if rows:
                self.api.del_port(port, bridge=self.bridge, if_exists=True).execute(check_error=True)
            return None
        opts = tunnel_options(spec, local_ip)
        api = self.api
        if rows and (rows[0]["type"] != spec.type or dict(rows[0]["options"]) != opts):
            # A type change cannot be done in place on every OVS; delete and add in one txn.
            with api.transaction(check_error=True) as txn:
                txn.add(api.del_port(port, bridge=self.bridge, if_exists=True))
            rows = []
        if not rows:
            with api.transaction(check_error=True) as txn:
                txn.add(api.add_port(self.bridge, port, may_exist=True))
                txn.add(api.db_set("Interface", port, ("type", spec.type), ("options", opts),
                                   ("external_ids", {EXT_OWNER: OWNER_NODE})))
        return self.ofport(port)

    def attach_port(self, name: str) -> int:
        """Attach an existing kernel link (``type=system``) to the bridge."""
        api = self.api
        with api.transaction(check_error=True) as txn:
            txn.add(api.add_port(self.bridge, name, may_exist=True))
            txn.add(api.db_set("Interface", name, ("external_ids", {EXT_OWNER: OWNER_NODE})))
        return self.ofport(name)

    def delete_port(self, name: str) -> None:
        self.api.del_port(name, bridge=self.bridge, if_exists=True).execute(check_error=True)

    def datapath_id(self) -> str | None:
        dpid = self._get("Bridge", self.bridge, "datapath_id")
        if isinstance(dpid, list):
            return dpid[0] if dpid else None
        return dpid or None

    # -- restart detection
    def vswitchd_instance(self) -> int | None:
        """One number per ovs-vswitchd instance: its pid with the pidfile's modification time.
        The pid alone is not enough once Open vSwitch runs in a container (Ferry's openvswitch
        container, routesync/openvswitch): a new container's PID namespace starts over and its
        ovs-vswitchd may get the pid of the one before it."""
        path = os.path.join(self.run_dir, "ovs-vswitchd.pid")
        try:
            with open(path) as f:
                pid = int(f.read().strip())
                mtime = os.fstat(f.fileno()).st_mtime_ns
        except (OSError, ValueError):
            return None
        return mtime * (1 << 22) + pid  # pids stay below 2**22 (the kernel's pid_max limit)

    def flow_restore_waiting(self) -> bool:
        """``other_config:flow-restore-wait`` is true: whoever started ovs-vswitchd is putting its
        saved flows back (Ferry's openvswitch container, the host's ``ovs-ctl restart``).  Read from
        the IDL's copy of the database, no round trip."""
        from routesync.openvswitch.plan import FLOW_RESTORE_WAIT

        other = self._get("Open_vSwitch", ".", "other_config")
        return str(dict(other or {}).get(FLOW_RESTORE_WAIT, "false")).lower() == "true"

    def pod_ports(self) -> list[dict[str, Any]]:
        """Interfaces the plugin created (``ferry-owner=pod``): name, ofport, external_ids."""
        rows = self.api.db_find("Interface", ("external_ids", "=", {EXT_OWNER: OWNER_POD}),
                                columns=["name", "ofport", "external_ids"]).execute(check_error=True)
        out = []
        for r in rows:
            of = r["ofport"]
            if isinstance(of, list):
                of = of[0] if of else -1
            out.append({"name": r["name"], "ofport": int(of or -1), "external_ids": dict(r["external_ids"])})
        return out

    def pod_port(self, name: str) -> dict[str, Any] | None:
        """One Pod interface by name (as :meth:`pod_ports` gives it), None when it is gone or not
        the plugin's: a lookup by the name index, not a scan of every port."""
        row = self.api.lookup("Interface", name, default=None)  # the IDL's copy, no transaction
        if row is None:
            return None
        ids = dict(row.external_ids)
        if ids.get(EXT_OWNER) != OWNER_POD:
            return None
        return {"name": name, "ofport": -1, "external_ids": ids}

    def replay_pod_flows(self, gateway_mac: str, gateway_ofport: int | None = None,
                         lock_dir: str | None = None, pending_namespaces: Iterable[str] = ()) -> int:
        """Re-install the per-Pod flows of every Pod port that has none (after an ovs-vswitchd
        restart all are gone), rebuilt from the port's external_ids with the plugin's own
        ``cni.pipeline.flows.pod_flows`` and cookie and installed the way the plugin installs them
        (``cni.ovs.openflow.bridge.OpenFlow.add_flows``), so they are indistinguishable from the plugin's and
        its CHECK and DEL find them.  A group that exists is never touched (the plugin owns
        it).  With ``lock_dir``, each Pod is replayed under the plugin's attachment lock and only
        if its port is still there, so a DEL that is half done (flows gone, port not yet) is never
        undone.  A Pod of ``pending_namespaces`` (namespaces with NetworkPolicies) gets its pending
        block too, as its ADD would have given it: closed until route-sync lifts it.  Returns the
        number of Pods replayed."""
        pending = frozenset(pending_namespaces)
        ports = self.pod_ports()
        want = pod_flow_groups(ports, gateway_mac, gateway_ofport, pending)
        if not want:
            return 0
        present = {f.cookie for f in self.dump_flows() if f.cookie in want}
        todo = sorted(c for c in want if c not in present)
        if not todo:
            return 0
        from cni.node.locks import attachment_lock
        from cni.ovs.openflow.bridge import OpenFlow
        from cni.pipeline.tables import EXT_CONTAINER_ID, EXT_IFNAME, pod_cookie

        of = OpenFlow(self.bridge, self.run_dir)
        if lock_dir is None:
            of.add_flows([f for c in todo for f in want[c]])
            self.flow_mods += sum(len(want[c]) for c in todo)
            LOG.info("per-Pod flows replayed for %d Pods", len(todo))
            return len(todo)
        keys = {}
        for p in ports:
            ids = p.get("external_ids") or {}
            cid, ifname = ids.get(EXT_CONTAINER_ID), ids.get(EXT_IFNAME)
            if cid and ifname:
                keys[pod_cookie(cid, ifname).value] = (cid, ifname, p["name"])
        done = 0
        for c in todo:
            cid, ifname, name = keys[c]
            with attachment_lock(lock_dir, cid, ifname):
                still = [p for p in self.pod_ports() if p["name"] == name]
                if not still or pod_flow_groups(still, gateway_mac, gateway_ofport, pending).get(c) != want[c]:
                    continue  # deleted (or re-plugged) meanwhile: the plugin has it in hand
                if any(f.cookie == c for f in self.dump_flows()):
                    continue
                of.add_flows(want[c])
                self.flow_mods += len(want[c])
                done += 1
        LOG.info("per-Pod flows replayed for %d Pods", done)
        return done

    def ensure_meter(self, meter_id: int, packets_per_second: int, burst: int) -> None:
        """OpenFlow meter ``meter_id`` as given (added, or modified when it is there: a flow using
        it keeps it), over the persistent session (opened again once when ovs-vswitchd restarted).
        Once per ovs-vswitchd instance and value (meters are not in the database: a restart loses them)."""
        from cni.ovs.openflow import codec
        from cni.ovs.openflow.session import ConnectionLost

        made = (self.vswitchd_instance(), packets_per_second, burst)
        if made[0] is not None and self._meters.get(meter_id) == made:
            return

        def send(command: int) -> None:
            msg = [codec.meter_mod(meter_id, packets_per_second, burst, 0, command)]
            try:
                self.session.transact(msg)
            except ConnectionLost:
                self.session.close()
                self.session.transact(msg)

        try:
            try:
                send(codec.OFPMC_ADD)
            except codec.SwitchRefused as e:
                if (e.etype, e.code) != (codec.OFPET_METER_MOD_FAILED, codec.OFPMMFC_METER_EXISTS):
                    raise
                send(codec.OFPMC_MODIFY)
        except OpenFlowError as e:
            raise OvsError(f"meter {meter_id} on {self.bridge} ({packets_per_second} packets/s, burst {burst}): {e}"
                           " (networkPolicyDeniedLog: {enabled: false} does without it)") from None
        self._meters[meter_id] = made

    # -- flows
    def _ofctl(self, command: str, *opts: str, extra: tuple[str, ...] = (),
               stdin: str | None = None) -> str:
        target = f"unix:{os.path.join(self.run_dir, self.bridge)}.mgmt"
        argv = ["ovs-ofctl", "-O", OF_VERSION, *opts, command, target, *extra]
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise OvsError(f"{' '.join(argv)}: {proc.stderr.strip()}")
        return proc.stdout

    def dump_flows(self) -> list[DumpedFlow]:
        return parse_dump(self._ofctl("dump-flows", "--no-names"))

    def canonical(self, flows: Iterable[Flow]) -> dict[int, frozenset[tuple[int, int, str, str]]]:
        """Desired flows in OVS's canonical text, grouped by cookie (cached per flow text)."""
        warm, self._canon_warm = self._canon_warm, None
        if warm is not None:
            warm.join()
        flows = list(flows)
        self._parse_canonical([f.text() for f in flows])
        groups: dict[int, set[tuple[int, int, str, str]]] = defaultdict(set)
        for f in flows:
            _, table, prio, match, actions = self._canon_cache[f.text()]
            groups[f.cookie.value].add((table, prio, match, actions))
        return {c: frozenset(s) for c, s in groups.items()}

    def _parse_canonical(self, texts: Iterable[str]) -> None:
        """``ovs-ofctl parse-flows`` of the texts not cached yet, into the cache."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._canon_cache))
        if not todo:
            return
        out = subprocess.run(["ovs-ofctl", "-O", OF_VERSION, "parse-flows", "-"],
                             input="\n".join(todo) + "\n", capture_output=True, text=True,
                             check=False)
        if out.returncode != 0:
            raise OvsError(f"invalid flow: {out.stderr.strip()}")
        parsed = parse_flow_mods(out.stdout)
        if len(parsed) != len(todo):
            raise OvsError(f"parse-flows gave {len(parsed)} flows for {len(todo)}")
        if len(self._canon_cache) > 200_000:
            self._canon_cache.clear()
        self._canon_cache.update(zip(todo, parsed))

    def sync_flows(self, desired: list[Flow]) -> FlowDiff:
        """Make the installed BASE/NODE/PEER flows equal ``desired``; POD flows are left alone."""
        for f in desired:
            if f.cookie.owner not in SYNCED_OWNERS:
                raise ValueError(f"route-sync does not own cookie {f.cookie} ({f.text()})")
        by_cookie: dict[int, list[Flow]] = defaultdict(list)
        for f in desired:
            by_cookie[f.cookie.value].append(f)
        have = {c: frozenset(x.canon() for x in fl)
                for c, fl in group_installed(self.dump_flows()).items()}
        # canonical text only where there is something to compare with
        want: dict[int, frozenset[Any]] = dict.fromkeys(by_cookie, frozenset())
        want.update(self.canonical([f for f in desired if f.cookie.value in have]))
        add, replace, delete, unchanged = plan_flow_sync(want, have)
        self._last = None
        self._send_bundle(add, replace, delete, by_cookie)
        self._last = (desired, _group(desired), False)
        if add:
            self._warm_canonical([f for c in add for f in by_cookie[c]])
        diff = FlowDiff(added=add, replaced=replace, deleted=delete, unchanged=unchanged,
                        flows_sent=sum(len(by_cookie[c]) for c in add + replace))
        if diff.changed:
            LOG.info("flows: +%d groups, ~%d replaced, -%d deleted, %d unchanged",
                     len(add), len(replace), len(delete), unchanged)
        return diff

    def sync_flow_delta(self, before: list[Flow], after: list[Flow]) -> FlowDiff:
        """Install the difference between two desired flow sets without reading OVS back:
        groups whose flows differ (as text) are replaced, new ones added, gone ones deleted, in
        one bundle.  For a Node change between full syncs; ``before`` must be what the last
        sync installed (drift is :meth:`sync_flows`' business).  A group of the very same Flow
        objects (the planner's memo hands them over for unchanged peers) is equal without
        rendering any text, and ``before`` is not grouped again when it is the list the last
        sync got: a change costs one pass over the flows, not text sets of all of them.  Where
        ``after`` tells which of its tracked flows changed since ``before``
        (:mod:`routesync.flowdelta`: the peers' and the policy's), only the rest is grouped."""
        joined = tail_changes(before, after)
        if joined is not None:
            return self._sync_joined_delta(before, after, *joined)
        last = self._last
        old = last[1] if last is not None and last[0] is before and not last[2] else _group(before)
        new = _group(after)
        add, replace, delete, unchanged = _compare(old, new)
        return self._send_delta(add, replace, delete, unchanged, new, (after, new, False))

    def _sync_joined_delta(self, before: list[Flow], after: list[Flow], old_head: list[Flow], new_head: list[Flow],
                           tails: list[tuple[TrackedFlows, Changed]]) -> FlowDiff:
        """:meth:`sync_flow_delta` where ``after``'s tracked parts (``routesync.flowdelta``: the
        peers' flows, the policy's) say which of their groups changed since ``before``'s: the
        base and Node flows (the head) grouped and compared as there, the tracked parts' changed
        groups taken as they are (named because they changed: no text to compare), the rest not
        looked at."""
        last = self._last
        old = last[1] if last is not None and last[0] is before and last[2] else _group(old_head)
        new = _group(new_head)
        add, replace, delete, unchanged = _compare(old, new)
        flows_of: dict[int, tuple[Flow, ...]] = dict(new)
        written = 0
        for tail, changed in tails:
            for c, (was, now) in changed.items():
                if not now:
                    if was:
                        delete.append(c)
                    continue
                if owner_of(c) not in SYNCED_OWNERS:
                    raise ValueError(f"route-sync does not own cookie {c:#x} ({now[0].text()})")
                if was == now:
                    continue
                (replace if was else add).append(c)
                flows_of[c] = now
                written += 1
            unchanged += tail.groups
        return self._send_delta(add, replace, delete, unchanged - written, flows_of, (after, new, True))

    def _send_delta(self, add: list[int], replace: list[int], delete: list[int], unchanged: int,
                    flows_of: Mapping[int, tuple[Flow, ...]],
                    last: tuple[list[Flow], dict[int, tuple[Flow, ...]], bool]) -> FlowDiff:
        add.sort()
        replace.sort()
        delete.sort()
        self._last = None
        self._send_bundle(add, replace, delete, {c: list(flows_of[c]) for c in add + replace})
        self._last = last
        diff = FlowDiff(added=add, replaced=replace, deleted=delete, unchanged=unchanged,
                        flows_sent=sum(len(flows_of[c]) for c in add + replace))
        if diff.changed:
            LOG.info("flows (delta): +%d groups, ~%d replaced, -%d deleted", len(add), len(replace), len(delete))
        return diff

    def _send_bundle(self, add: list[int], replace: list[int], delete: list[int],
                     flows_by_cookie: dict[int, list[Flow]]) -> None:
        """Delete ``delete`` + ``replace`` groups and add ``replace`` + ``add`` groups in one
        atomic bundle over the persistent OpenFlow session.  Only a bundle of more than
        NATIVE_MAX_FRESH never-encoded flows (a first full pass) goes through ``ovs-ofctl --bundle``
        instead, for speed.  A flow the codec cannot express raises (a planner bug, which
        tests/cni/ovs/test_codec.py keeps out); a bundle the switch refused raises OvsError."""
        if not (add or replace or delete):
            return
        adds = [f for c in list(replace) + list(add) for f in flows_by_cookie[c]]
        self.flow_mods += len(delete) + len(replace) + len(adds)
        fresh = sum(1 for f in adds if not self.session.encoded(f))
        if fresh > NATIVE_MAX_FRESH:
            self._ofctl("add-flows", "--bundle", extra=("-",),
                        stdin=bundle_text(add, replace, delete, flows_by_cookie))
            self.ofctl_bundles += 1
            return
        messages = self.session.encode([Cookie.parse(c) for c in list(delete) + list(replace)], adds)
        try:
            self.session.bundle(messages)
        except OpenFlowError as e:
            raise OvsError(f"flow bundle on {self.bridge}: {e}") from None
        self.native_bundles += 1

    def _warm_canonical(self, flows: list[Flow]) -> None:
        """Fill the canonical-text cache for ``flows`` in a background thread (the next full
        pass compares them with a dump); :meth:`canonical` waits for it."""
        if self._canon_warm is not None:
            return

        texts = [f.text() for f in flows]

        def run() -> None:
            try:
                self._parse_canonical(texts)
            except Exception as e:  # noqa: BLE001 - the next full pass parses (and reports) again
                LOG.debug("canonical text not cached: %s", e)

        t = threading.Thread(target=run, name="ferry-canon", daemon=True)
        t.start()
        self._canon_warm = t

    def delete_flows_in(self, table: int, cookies: Iterable[Cookie]) -> None:
        """Delete the flows of each of ``cookies`` in ``table`` only, in one bundle."""
        from cni.ovs.openflow import codec

        messages = [codec.flow_mod_delete(c, table=table) for c in cookies]
        if not messages:
            return
        try:
            self.session.bundle(messages)
        except OpenFlowError as e:
            raise OvsError(f"flow bundle on {self.bridge}: {e}") from None

    def delete_flows(self, cookie: Cookie) -> None:
        self._send_bundle([], [], [cookie.value], {})

    def replace_group(self, cookie: Cookie, flows: list[Flow]) -> None:
        """Replace one cookie group atomically (delete + add in one bundle)."""
        for f in flows:
            if f.cookie != cookie:
                raise ValueError(f"flow {f.text()} is not of cookie {cookie}")
        self._send_bundle([], [cookie.value], [], {cookie.value: flows})

    def set_mtu_request(self, iface: str, mtu: int) -> bool:
        """``Interface.mtu_request`` (OVS applies it to internal ports and keeps it)."""
        current = self._get("Interface", iface, "mtu_request")
        if current == mtu or current == [mtu]:
            return False
        self.api.db_set("Interface", iface, ("mtu_request", mtu)).execute(check_error=True)
        return True
