"""The ``ferry`` entry of a conflist, validated, merged with the node state into what a command needs."""

from __future__ import annotations

import os
import time

from cni.lean.patience import patiently
from cni.lean.record import Factory, record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    from cni.pipeline.modes import Datapath, Mode

    T = TypeVar("T")

from cni.lean import addr, fastjson
from cni.node import nodestate
from cni.pipeline.modes import DATAPATHS, ENCAP, SYSTEM, is_datapath
from cni.pipeline.tables import DEFAULT_BRIDGE, GATEWAY_PORT, MAX_IFNAME
from cni.spec.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CniError

DEFAULT_OVSDB = "unix:/var/run/openvswitch/db.sock"
DEFAULT_OVS_RUN_DIR = "/var/run/openvswitch"
# How long a call waits for the Node's parts to start: an ADD for route-sync's first state file
# (else code 11), a DEL for ovsdb-server (else an error). A Node that has just started (a reboot)
# runs its Pods' DELs and ADDs while the switch's and route-sync's Pods start, and the kubelet's
# retry after a failure comes ~10 s later; both are there within seconds.
DEFAULT_STARTUP_WAIT = 10.0
MAX_STARTUP_WAIT = 60.0


@record(frozen=True)
class PluginConfig:
    """Ferry's own keys of the network config (see docs/design/contracts.md, "Plugin configuration")."""

    network: str
    state_file: str = nodestate.DEFAULT_STATE_FILE
    bridge: str | None = None
    ovsdb: str | None = None
    ovs_run_dir: str | None = None
    datapath: Datapath | None = None
    mtu: int = 0
    startup_wait: float = DEFAULT_STARTUP_WAIT
    ipam: dict[str, Any] = Factory(dict)
    dns: dict[str, Any] = Factory(dict)

    @property
    def explicit_ranges(self) -> bool:
        return bool(self.ipam.get("ranges"))

    @property
    def lock_dir(self) -> str:
        return os.path.join(os.path.dirname(self.state_file) or ".", "locks")


def _field(conf: dict[str, Any], key: str, kind: type[T], default: Any = fastjson.REQUIRED, nonempty: bool = False,
           falsy_default: bool = False) -> T:
    try:
        return fastjson.field(conf, key, kind, default, nonempty=nonempty, falsy_default=falsy_default)
    except fastjson.FieldError as e:
        raise CniError(INVALID_CONFIG, f"config field {key!r} must be {e.expected}") from None


def _opt_str(conf: dict[str, Any], key: str) -> str | None:
    """None when absent or null, else a non-empty string without a NUL."""
    if conf.get(key) is None:
        return None
    value = _field(conf, key, str, nonempty=True)
    if "\x00" in value:
        raise CniError(INVALID_CONFIG, f"config field {key!r} must be a non-empty string")
    return value


def parse(conf: dict[str, Any]) -> PluginConfig:
    """Validate Ferry's keys; every error names the field."""
    bridge = _opt_str(conf, "bridge")
    if bridge is not None and (len(bridge.encode()) > MAX_IFNAME
                               or not bridge.replace("-", "").replace("_", "").isalnum()):
        raise CniError(INVALID_CONFIG, f"config field 'bridge' {bridge!r} is not a valid bridge name")
    datapath = _opt_str(conf, "datapath")
    if datapath is not None and not is_datapath(datapath):
        raise CniError(INVALID_CONFIG, f"config field 'datapath' must be one of {', '.join(DATAPATHS)}")
    mtu = conf.get("mtu", 0)
    if not isinstance(mtu, int) or isinstance(mtu, bool) or not (mtu == 0 or 68 <= mtu <= 65535):
        raise CniError(INVALID_CONFIG, "config field 'mtu' must be an integer between 68 and 65535")
    ipam = _field(conf, "ipam", dict, {}, falsy_default=True)
    if ipam and ipam.get("type") not in ("ferry-ipam", None):
        raise CniError(INVALID_CONFIG, f"config field 'ipam.type' {ipam.get('type')!r}: only 'ferry-ipam' is supported")
    dns = _field(conf, "dns", dict, {}, falsy_default=True)
    startup_wait = conf.get("startupWaitSeconds", DEFAULT_STARTUP_WAIT)
    if not isinstance(startup_wait, (int, float)) or isinstance(startup_wait, bool) \
            or not 0 <= startup_wait <= MAX_STARTUP_WAIT:
        raise CniError(INVALID_CONFIG, f"config field 'startupWaitSeconds' must be a number of seconds "
                                       f"between 0 and {MAX_STARTUP_WAIT:g}")
    ovsdb = _opt_str(conf, "ovsdb")
    if ovsdb is not None and not ovsdb.startswith("unix:"):
        raise CniError(INVALID_CONFIG, "config field 'ovsdb' must be 'unix:<path to db.sock>'")
    return PluginConfig(
        network=str(conf.get("name", "")),
        state_file=_opt_str(conf, "stateFile") or nodestate.DEFAULT_STATE_FILE,
        bridge=bridge,
        ovsdb=ovsdb,
        ovs_run_dir=_opt_str(conf, "ovsRunDir"),
        datapath=datapath,
        mtu=mtu,
        startup_wait=float(startup_wait),
        ipam=ipam,
        dns=dns,
    )


@record(frozen=True)
class NodeContext:
    """What a command needs to know about this Node, from the state file or (lone Node) the conf."""

    bridge: str
    ovsdb: str
    ovs_run_dir: str
    datapath: str
    mtu: int
    pod_cidrs: list[str]
    mode: Mode
    state: nodestate.NodeState | None  # None on a lone Node (no route-sync)

    @property
    def lone(self) -> bool:
        return self.state is None

    @property
    def gateway_name(self) -> str:
        return self.state.gateway.name if self.state is not None else GATEWAY_PORT


def lone_pod_cidrs(conf: PluginConfig) -> list[str]:
    """The subnets of the explicit IPAM ranges (first range of each set)."""
    cidrs = []
    for i, rset in enumerate(conf.ipam.get("ranges") or []):
        if not isinstance(rset, list) or not rset or not isinstance(rset[0], dict):
            raise CniError(INVALID_CONFIG, f"config field 'ipam.ranges[{i}]' must be a non-empty list of ranges")
        try:
            cidrs.append(addr.canonical_network(str(rset[0].get("subnet"))))
        except ValueError:
            raise CniError(INVALID_CONFIG, f"config field 'ipam.ranges[{i}][0].subnet' is not a CIDR") from None
    return cidrs


def read_state(path: str, wait: float, notice: Callable[[str], None] | None = None) -> nodestate.NodeState:
    """The state file, waiting up to ``wait`` seconds for it to appear (route-sync's first write
    after the Node started); :class:`nodestate.StateError` as :func:`nodestate.read` raises it.
    ``notice`` hears one line when the wait starts and one when it ends."""
    start = time.monotonic()
    waited: list[bool] = []

    def waiting() -> None:
        waited.append(True)
        if notice is not None:
            notice(f"waiting up to {wait:g} s for route-sync's node state at {path}")

    try:
        state = patiently(lambda: nodestate.read(path), nodestate.StateMissing, wait, waiting)
    except nodestate.StateMissing:
        if notice is not None and wait > 0:
            notice(f"no node state at {path} after {wait:g} s: try again later")
        raise
    if notice is not None and waited:
        notice(f"node state at {path} after {time.monotonic() - start:.2f} s")
    return state


def node_context(conf: PluginConfig, need_state: bool, wait: Callable[[str], None] | None = None) -> NodeContext:
    """Merge the node state (if any) with the conf. ``need_state``: ADD without explicit
    ranges cannot run before route-sync has written the state file (code 11); given ``wait`` (ADD:
    its logger), it first waits up to the conf's ``startupWaitSeconds`` for the file to appear."""
    patient = need_state and wait is not None and not conf.explicit_ranges
    try:
        state: nodestate.NodeState | None = read_state(conf.state_file, conf.startup_wait if patient else 0.0, wait)
    except nodestate.StateError as e:
        if need_state and not conf.explicit_ranges:
            raise CniError(TRY_AGAIN_LATER, str(e)) from None
        state = None
    if state is not None:
        return NodeContext(
            bridge=conf.bridge or state.bridge,
            ovsdb=conf.ovsdb or state.ovsdb,
            ovs_run_dir=conf.ovs_run_dir or state.ovsRunDir,
            datapath=state.datapath,
            mtu=conf.mtu or state.mtu,
            pod_cidrs=list(state.podCIDRs),
            mode=state.mode,
            state=state,
        )
    return NodeContext(
        bridge=conf.bridge or DEFAULT_BRIDGE,
        ovsdb=conf.ovsdb or DEFAULT_OVSDB,
        ovs_run_dir=conf.ovs_run_dir or DEFAULT_OVS_RUN_DIR,
        datapath=conf.datapath or SYSTEM,
        mtu=conf.mtu or 1500,
        pod_cidrs=lone_pod_cidrs(conf) if conf.explicit_ranges else [],
        mode=ENCAP,
        state=None,
    )

