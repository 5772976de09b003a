"""GC of the ``ferry`` plugin: release every attachment the runtime no longer lists.

OVS ports owned by a Pod whose (container ID, ifname) is not in ``cni.dev/valid-attachments`` go
with their flows and veths (a chained port: only what Ferry added to it), then IPAM frees the
addresses of every attachment not listed.  Standard library only: this runs once per call."""

from __future__ import annotations

from cni.commands.steps import Step, ipam_for, ovs_clients, reported
from cni.node import config as cfg
from cni.pipeline import tables as pl
from cni.spec.request import Request


def gc(req: Request) -> None:
    conf = cfg.parse(req.config)
    node = cfg.node_context(conf, need_state=False)
    valid = set()
    for a in req.config.get("cni.dev/valid-attachments") or []:
        if isinstance(a, dict):
            valid.add((str(a.get("containerID", "")), str(a.get("ifname", ""))))
    from cni.kernel.netlink import Netlink

    ovsdb, of = ovs_clients(node)
    released = []
    step = Step()
    step("GC of OVS ports")
    with reported(step), Netlink() as host_nl:
        for port in ovsdb.find_ports({pl.EXT_OWNER: pl.OWNER_POD}):
            cid, ifname = port.external_ids.get(pl.EXT_CONTAINER_ID, ""), port.external_ids.get(pl.EXT_IFNAME, "")
            if (cid, ifname) in valid:
                continue
            if port.external_ids.get(pl.EXT_CHAINED):  # the veth is the primary CNI's: undo only ours
                from cni.commands import chained

                chained.undo_port(host_nl, ovsdb, of, node, port)
            else:
                of.del_flows(pl.pod_cookie(cid, ifname))
                ovsdb.del_port(node.bridge, port.name)
                host_nl.link_del(port.name)
            released.append(f"{cid}/{ifname}")
    if conf.ipam or node.pod_cidrs:
        ipam_api, ipam_conf = ipam_for(req.config, node)
        for cid, ifname in ipam_api.gc(ipam_conf, valid):
            released.append(f"{cid}/{ifname} (IPAM)")
    req.logger().info(f"GC released {len(released)} attachments: {', '.join(released) or '-'}")
