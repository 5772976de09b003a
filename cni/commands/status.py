"""STATUS of the ``ferry`` plugin: can this Node take an ADD now?

Ready when the node state is readable (or the Node is lone), Open vSwitch answers, the bridge
exists where route-sync should have made it, and IPAM has addresses to give; otherwise
``CniError(NOT_READY)`` saying why.  Standard library only: this runs once per call."""

from __future__ import annotations

from cni.commands.steps import ipam_for, ovs_clients
from cni.node import config as cfg
from cni.spec.errors import NOT_READY, CniError
from cni.spec.request import Request


def status(req: Request) -> None:
    conf = cfg.parse(req.config)
    try:
        node = cfg.node_context(conf, need_state=True)
    except CniError as e:
        raise CniError(NOT_READY, e.msg) from None
    ovsdb, _ = ovs_clients(node)
    try:
        if node.state is not None and ovsdb.bridge(node.bridge) is None:
            raise CniError(NOT_READY, f"bridge {node.bridge} does not exist")
        if node.state is None:
            ovsdb.bridge(node.bridge)  # reachable is enough: ADD creates the bridge on a lone Node
    except CniError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to reach OVS means "not ready"
        raise CniError(NOT_READY, f"Open vSwitch is not reachable at {node.ovsdb}: {e}") from None
    ipam_api, ipam_conf = ipam_for(req.config, node)
    ipam_api.status(ipam_conf)
