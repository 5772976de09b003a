"""GC of the ``ferry`` plugin: release every attachment the runtime no longer lists.

OVS ports owned by a Pod whose (container ID, ifname) is not in ``cni.dev/valid-attachments`` go
with their flows and veths (a chained port: only what Ferry added to it), then IPAM frees the
addresses of every attachment not listed.  Each attachment goes under its attachment lock
(``cni.node.locks``), as in DEL: route-sync's replay of per-Pod flows after an ovs-vswitchd restart
and its Pod MTU sync take the same lock, so neither puts flows back for, or enters, a Pod that GC
has half removed; the ports are looked up again under the lock (a DEL may have taken them meanwhile).
Standard library only: this runs once per call."""

from __future__ import annotations

from cni.commands.steps import Step, ipam_for, ovs_clients, reported
from cni.lean.typecheck import TYPE_CHECKING
from cni.node import config as cfg
from cni.pipeline import tables as pl
from cni.spec.request import Request

if TYPE_CHECKING:
    from cni.ovs.ovsdb import PortInfo


def gc(req: Request) -> None:
    conf = cfg.parse(req.config)
    node = cfg.node_context(conf, need_state=False)
    valid = set()
    for a in req.config.get("cni.dev/valid-attachments") or []:
        if isinstance(a, dict):
            valid.add((str(a.get("containerID", "")), str(a.get("ifname", ""))))
    from cni.kernel.netlink import Netlink
    from cni.node.locks import attachment_lock

    ovsdb, of = ovs_clients(node)
    released = []
    step = Step()
    step("GC of OVS ports")
    with reported(step), Netlink() as host_nl:
        stale: dict[tuple[str, str], list[PortInfo]] = {}
        for port in ovsdb.find_ports({pl.EXT_OWNER: pl.OWNER_POD}):
            key = (port.external_ids.get(pl.EXT_CONTAINER_ID, ""), port.external_ids.get(pl.EXT_IFNAME, ""))
            if key not in valid:
                stale.setdefault(key, []).append(port)
        for (cid, ifname), listed in sorted(stale.items()):
            with attachment_lock(conf.lock_dir, cid, ifname) as lock:
                ports = listed
                if cid and ifname:  # again under the lock: a DEL may have taken them meanwhile
                    ports = [p for p in ovsdb.find_ports({pl.EXT_CONTAINER_ID: cid, pl.EXT_IFNAME: ifname})
                             if p.external_ids.get(pl.EXT_OWNER) == pl.OWNER_POD]
                for port in ports:
                    if port.external_ids.get(pl.EXT_CHAINED):  # the veth is the primary CNI's: undo only ours
                        from cni.commands import chained

                        chained.undo_port(host_nl, ovsdb, of, node, port)
                    else:
                        of.del_flows(pl.pod_cookie(cid, ifname))
                        ovsdb.del_port(node.bridge, port.name)
                        host_nl.link_del(port.name)
                    released.append(f"{cid}/{ifname}")
                lock.remove()  # as DEL: no lock file left for an attachment that is gone
    if conf.ipam or node.pod_cidrs:
        ipam_api, ipam_conf = ipam_for(req.config, node)
        for cid, ifname in ipam_api.gc(ipam_conf, valid):
            released.append(f"{cid}/{ifname} (IPAM)")
    req.logger().info(f"GC released {len(released)} attachments: {', '.join(released) or '-'}")
