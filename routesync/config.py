"""route-sync's configuration: ``/etc/ferry/route-sync.yaml`` (or ``--config``) into a :class:`Config`.

Every key is validated here, once; a bad value or an unknown key raises :class:`ConfigError` with
the key's name in the message, and the CLI exits non-zero with it.  Nothing else in route-sync
re-validates the config."""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

from cni.lean import fastjson
from cni.node.nodestate import DEFAULT_STATE_FILE
from cni.pipeline.match import VLAN_MAX, VLAN_MIN
from cni.pipeline.modes import (
    DATAPATHS,
    ENCAP,
    ENCRYPTION_NONE,
    ENCRYPTION_WIREGUARD,
    ENCRYPTIONS,
    FAST_PATH_MODES,
    GENEVE,
    GRE,
    MODES,
    NETDEV,
    NETWORK_POLICY_ONLY,
    NO_ENCAP,
    STT,
    TUNNEL_TYPES,
    TUNNELLED_MODES,
    VXLAN,
)
from cni.pipeline.tables import DEFAULT_BRIDGE, MAX_IFNAME

if TYPE_CHECKING:
    from cni.pipeline.modes import Datapath, Encryption, Mode, TunnelType

DEFAULT_CONFIG_FILE = "/etc/ferry/route-sync.yaml"

# ovsDaemons: who runs ovsdb-server and ovs-vswitchd for the Node (routesync/openvswitch)
OvsDaemons = Literal["ferry", "host"]
OVS_FERRY: Final = "ferry"  # Ferry's openvswitch container (deploy/ferry.yaml)
OVS_HOST: Final = "host"  # the host's own Open vSwitch; the container only watches it
OVS_DAEMONS: tuple[OvsDaemons, ...] = (OVS_FERRY, OVS_HOST)

DEFAULT_TUNNEL_PORTS: dict[TunnelType, int | None] = {VXLAN: 4789, GENEVE: 6081, STT: 7471, GRE: None}
MAC_SOURCES = ("annotation", "neighbor", "both")
SOURCE_TYPES = ("registry", "kubernetes")
DEFAULT_REGISTRY_DIR = "/var/lib/ferry/registry"
MAX_ASN = 4294967295  # 4-octet AS numbers (RFC 6793)
DEFAULT_HOLD_TIME = 90  # seconds (RFC 4271's suggestion; FRR's and ExaBGP's default too)
MAX_MD5_KEY = 80  # TCP_MD5SIG_MAXKEYLEN


class ConfigError(ValueError):
    """A config key is unknown or has a bad value; the message names the key."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        super().__init__(f"config key {key!r}: {problem}")


NODE_SOURCE_KEYS = {"type", "registryDir", "kubeconfig", "pollInterval"}


@dataclass(frozen=True)
class NodeSourceConfig:
    type: str = "registry"  # registry | kubernetes
    registry_dir: str = DEFAULT_REGISTRY_DIR
    kubeconfig: str | None = None  # kubernetes: None = in-cluster, then ~/.kube/config
    poll_interval: float = 0.1  # registry: seconds between directory scans


@dataclass(frozen=True)
class BgpPeer:
    """One BGP neighbour (the underlay router): ``bgp.peers[i]``."""

    address: str  # "192.168.77.1" or "fd00:77::1"; or DEFAULT_GATEWAY (resolved at start)
    asn: int
    password: str | None = None  # TCP MD5 signature (RFC 2385)
    hold_time: int = DEFAULT_HOLD_TIME  # seconds; 0: no keepalives (the peer's choice may be lower)
    address_family: int | None = None  # with DEFAULT_GATEWAY: whose default route (4 or 6)

    @property
    def default_gateway(self) -> bool:
        """The peer is the Node's default gateway of ``address_family``, looked up at start: one
        ConfigMap then serves Nodes on different segments (``routesync.bgp.gateway``)."""
        return self.address == DEFAULT_GATEWAY


@dataclass(frozen=True)
class BgpConfig:
    """The ``bgp`` section: route-sync advertises this Node's Pod CIDRs to the underlay routers
    through ExaBGP (``routesync.bgp``)."""

    local_asn: int
    peers: tuple[BgpPeer, ...]
    router_id: str | None = None  # None: the Node's transport IPv4 address
    prefixes: tuple[str, ...] | None = None  # None: the Node's Pod CIDRs (as its record names them)
    graceful_restart: int = 0  # seconds a peer keeps our routes through a restart; 0: off
    run_dir: str | None = None  # ExaBGP's config, API socket and status file; None: <state dir>/bgp


# wireguard.implementation: which WireGuard a Node uses (routesync/wireguard/device.py)
WgImplementation = Literal["auto", "kernel", "userspace"]
WG_AUTO: Final = "auto"  # the kernel's when it has the module, else the userspace one
WG_KERNEL: Final = "kernel"
WG_USERSPACE: Final = "userspace"
WG_IMPLEMENTATIONS: tuple[WgImplementation, ...] = (WG_AUTO, WG_KERNEL, WG_USERSPACE)
DEFAULT_WG_PORT = 51820
WG_SECTION = "wireguard"  # the config's section key (trafficEncryptionMode's word is modes.ENCRYPTION_WIREGUARD)


@dataclass(frozen=True)
class WireGuardConfig:
    """The ``wireguard`` section (``trafficEncryptionMode: wireguard``): routesync/wireguard."""

    port: int = DEFAULT_WG_PORT  # the UDP port the device listens on (and peers send to)
    interface: str = "ferry-wg0"
    implementation: WgImplementation = WG_AUTO
    # the userspace implementation (wireguard-go) and where its UAPI sockets live
    # (``<runDir>/<interface>.sock``; another dir than /var/run/wireguard is bind-mounted there for it)
    userspace_command: str = "wireguard-go"
    run_dir: str = "/var/run/wireguard"
    key_dir: str = "/var/lib/ferry/wireguard"  # private keys (0600), never in the API or a log
    rotation_period: float = 0.0  # seconds between automatic key rotations; 0: only rotate-key
    rotation_lead: float = 2.0  # seconds between announcing a new key and every Node switching to it
    persistent_keepalive: int = 0  # seconds (0: off); behind a NAT a peer needs it
    # route-sync starts the userspace device itself (the lab, a host without containers); false:
    # another process does (the DaemonSet's openvswitch container supervises it), route-sync
    # waits for its socket
    start_userspace: bool = True


# policyPeers: where route-sync's policy gets the Pods it plans from (routesync/policy/watch.py)
PolicyPeers = Literal["cluster", "peerSlices"]
PEERS_CLUSTER: Final = "cluster"  # a watch of every Pod of the cluster
# its own Pods (a watch of the Pods bound to this Node) and the remote Pods ferry-controller's
# PeerSlices hold for it (docs/design/peerslices.md): a Node receives what concerns it
PEERS_SLICES: Final = "peerSlices"
POLICY_PEERS: tuple[PolicyPeers, ...] = (PEERS_CLUSTER, PEERS_SLICES)

DENIED_LOG_SECTION = "networkPolicyDeniedLog"
DENIED_LOG_KEYS = {"enabled", "rate", "burst"}
METER_FACTOR = 10  # the switch's meter admits this many times the log's rate and burst


@dataclass(frozen=True)
class DeniedLogConfig:
    """The ``networkPolicyDeniedLog`` section: a log line per connection a Pod's isolation denied
    (routesync/policy/deniedlog.py), on by default with NetworkPolicy, at most ``burst`` lines at
    once and ``rate`` a second on average per Node (a token bucket; what it leaves out is counted,
    ``ferry_route_sync_policy_denied_log_suppressed_total``).  The switch's meter lets
    ``METER_FACTOR`` times that many packet-ins a second up to route-sync and drops the rest in
    the datapath, so a flood reaches neither ovs-vswitchd nor route-sync."""

    enabled: bool = True
    rate: int = 10  # lines per second, on average
    burst: int = 100  # lines at once

    @property
    def meter(self) -> tuple[int, int]:
        """The meter's (packets per second, burst)."""
        return METER_FACTOR * self.rate, METER_FACTOR * self.burst


@dataclass(frozen=True)
class Config:
    node_name: str
    mode: Mode = ENCAP
    tunnel_type: TunnelType = VXLAN
    tunnel_port: int | None = DEFAULT_TUNNEL_PORTS[VXLAN]
    transport_interface: str = "eth0"
    transport_interface_cidrs: tuple[str, ...] = ()
    # the underlay is 802.1Q VLAN ``transport_vlan`` (a trunk port): OVS tags what leaves the
    # uplink and takes in only frames tagged with it; None: untagged
    transport_vlan: int | None = None
    no_snat: bool = False
    default_mtu: int = 0
    bridge: str = DEFAULT_BRIDGE
    datapath_type: Datapath = NETDEV
    ovsdb: str = "unix:/var/run/openvswitch/db.sock"
    ovs_run_dir: str = "/var/run/openvswitch"
    state_file: str = DEFAULT_STATE_FILE
    pod_cidrs: tuple[str, ...] = ()
    cluster_cidrs: tuple[str, ...] = ()
    node_source: NodeSourceConfig = field(default_factory=NodeSourceConfig)
    fast_path: bool = False
    mac_source: str = "annotation"
    resync_seconds: float = 60.0
    log_file: str | None = None
    bgp: BgpConfig | None = None
    # NetworkPolicy (routesync/policy): on by default with the Kubernetes source; the Service
    # CIDRs' egress is judged after kube-proxy's DNAT (empty: judged on the ClusterIP)
    network_policy: bool = True
    service_cidrs: tuple[str, ...] = ()
    denied_log: DeniedLogConfig = field(default_factory=DeniedLogConfig)
    # the Pods policy plans from: every Pod of the cluster, or this Node's own and its PeerSlices'
    policy_peers: PolicyPeers = PEERS_CLUSTER
    # who runs ovsdb-server and ovs-vswitchd (routesync/openvswitch): the host (its own packages or
    # service) or Ferry's own ``openvswitch`` container (deploy/ferry.yaml), which keeps the
    # database at ovs_database and the daemons' logs in ovs_log_dir
    ovs_daemons: OvsDaemons = OVS_HOST
    ovs_database: str = "/var/lib/ferry/openvswitch/conf.db"
    ovs_log_dir: str = "/var/log/ferry"
    # Pod traffic between Nodes encrypted (routesync/wireguard): none | wireguard
    encryption: Encryption = ENCRYPTION_NONE
    wireguard: WireGuardConfig = field(default_factory=WireGuardConfig)

    @property
    def encrypted(self) -> bool:
        return self.encryption != ENCRYPTION_NONE

    @property
    def bgp_run_dir(self) -> str:
        """Where the BGP speaker keeps its files (``bgp.runDir``, else ``bgp/`` beside the state file)."""
        if self.bgp is not None and self.bgp.run_dir:
            return self.bgp.run_dir
        return os.path.join(os.path.dirname(self.state_file) or ".", "bgp")

    @property
    def tunnelled(self) -> bool:
        """A tunnel port is wanted: encap and hybrid, unless WireGuard carries every peer instead."""
        return self.mode in TUNNELLED_MODES and not self.encrypted

    @property
    def remote_egress(self) -> bool:
        """Policy judges a remote client's egress here too (``routesync.policy.plan.NodeFacts``):
        with every Pod watched (``policyPeers: cluster``); with PeerSlices egress is judged at its
        source only, so a Node does not read every egress-isolated Pod (docs/design/scale.md)."""
        return self.policy_peers == PEERS_CLUSTER


# --- value checkers: each takes (key, raw value) and returns the typed value or raises -------------

_T = TypeVar("_T")


def _typed(kind: type[_T], key: str, v: Any, lo: int | None = None, hi: int | None = None) -> _T:
    """``v`` when it is a ``kind`` (a string: not empty; an integer: in [lo, hi])."""
    try:
        return fastjson.check(key, v, kind, nonempty=kind is str, lo=lo, hi=hi)
    except fastjson.FieldError as e:
        raise ConfigError(key, f"expected {e.expected}, got {v!r}") from None


_Word = TypeVar("_Word", bound=str)


def _choice(key: str, v: Any, choices: tuple[_Word, ...]) -> _Word:
    if isinstance(v, str):
        for c in choices:
            if c.lower() == v.lower():
                return c
    raise ConfigError(key, f"expected one of {', '.join(choices)}, got {v!r}")


def _ifname(key: str, v: Any) -> str:
    name = _typed(str, key, v)
    if len(name.encode()) > MAX_IFNAME or "/" in name or any(c.isspace() for c in name):
        raise ConfigError(key, f"not a valid interface name: {name!r}")
    return name


def vlan_id(key: str, v: Any) -> int:
    """An 802.1Q VLAN ID, an integer 1..4094 (0 is a priority tag, 4095 reserved)."""
    if isinstance(v, bool) or not isinstance(v, int) or not VLAN_MIN <= v <= VLAN_MAX:
        raise ConfigError(key, f"expected a VLAN ID in [{VLAN_MIN}, {VLAN_MAX}] (0 is a priority tag, "
                               f"4095 reserved), got {v!r}")
    return v


def _cidrs(key: str, v: Any, host_bits: bool) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [s.strip() for s in v.split(",") if s.strip()]
    if not isinstance(v, list):
        raise ConfigError(key, f"expected a list of CIDRs, got {v!r}")
    out: list[str] = []
    for item in v:
        try:
            if host_bits:  # an interface address: "192.168.77.11/24"
                out.append(str(ipaddress.ip_interface(str(item))))
            else:
                out.append(str(ipaddress.ip_network(str(item), strict=True)))
        except ValueError as e:
            raise ConfigError(key, f"bad CIDR {item!r} ({e})") from None
    families = [ipaddress.ip_network(c, strict=False).version for c in out]
    if not host_bits and len(families) != len(set(families)) and key == "podCIDRs":
        raise ConfigError(key, "at most one Pod CIDR per address family")
    return tuple(out)


def _section(key: str, v: Any, allowed: set[str], expected: str) -> None:
    """A nested mapping of known keys: ``key`` itself or ``key.<unknown>`` named otherwise."""
    if not isinstance(v, dict):
        raise ConfigError(key, f"expected {expected}, got {v!r}")
    for k in v:
        if k not in allowed:
            raise ConfigError(f"{key}.{k}", "unknown key")


def _abspath(key: str, v: Any) -> str:
    s = _typed(str, key, v)
    if not os.path.isabs(s):
        raise ConfigError(key, f"expected an absolute path, got {s!r}")
    return s


def _ovsdb(key: str, v: Any) -> str:
    s = _typed(str, key, v)
    if not s.startswith(("unix:", "tcp:", "ssl:")):
        raise ConfigError(key, f"expected unix:PATH, tcp:IP:PORT or ssl:IP:PORT, got {s!r}")
    return s


def _node_source(key: str, v: Any) -> NodeSourceConfig:
    _section(key, v, NODE_SOURCE_KEYS, "a mapping")
    d = NodeSourceConfig()
    kind = _choice(f"{key}.type", v.get("type", d.type), SOURCE_TYPES)
    if kind == "registry" and "kubeconfig" in v:
        raise ConfigError(f"{key}.kubeconfig", "only valid with type kubernetes")
    if kind == "kubernetes" and "registryDir" in v:
        raise ConfigError(f"{key}.registryDir", "only valid with type registry")
    poll = v.get("pollInterval", d.poll_interval)
    if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not 0.01 <= poll <= 5:
        raise ConfigError(f"{key}.pollInterval", f"expected seconds in [0.01, 5], got {poll!r}")
    return NodeSourceConfig(
        type=kind,
        registry_dir=_typed(str, f"{key}.registryDir", v.get("registryDir", d.registry_dir)),
        kubeconfig=(_typed(str, f"{key}.kubeconfig", v["kubeconfig"]) if v.get("kubeconfig") is not None
                    else d.kubeconfig),
        poll_interval=float(poll),
    )


def _ip(key: str, v: Any, version: int | None = None) -> str:
    try:
        addr = ipaddress.ip_address(str(v)) if isinstance(v, str) else None
    except ValueError:
        addr = None
    if addr is None or (version is not None and addr.version != version):
        want = f"an IPv{version} address" if version else "an IP address"
        raise ConfigError(key, f"expected {want}, got {v!r}")
    return str(addr)


BGP_KEYS = {"localASN", "routerID", "peers", "prefixes", "gracefulRestart", "runDir"}
PEER_KEYS = {"address", "asn", "password", "holdTime", "addressFamily"}
DEFAULT_GATEWAY: Final = "defaultGateway"  # bgp.peers[].address: the Node's default gateway
ADDRESS_FAMILIES = {"ipv4": 4, "ipv6": 6}


def _hold_time(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not (v == 0 or 3 <= v <= 65535):
        raise ConfigError(key, f"expected 0 (no keepalives) or seconds in [3, 65535] (RFC 4271), got {v!r}")
    return v


def _bgp_peer(key: str, v: Any) -> BgpPeer:
    _section(key, v, PEER_KEYS, "a mapping with address and asn")
    for k in ("address", "asn"):
        if k not in v:
            raise ConfigError(f"{key}.{k}", "missing")
    password = v.get("password")
    if password is not None:
        password = _typed(str, f"{key}.password", password)
        if len(password.encode()) > MAX_MD5_KEY or '"' in password or "\n" in password:
            raise ConfigError(f"{key}.password", f"at most {MAX_MD5_KEY} bytes, no '\"' or newline")
    family = None
    if v["address"] == DEFAULT_GATEWAY:
        fam = v.get("addressFamily", "ipv4")
        if fam not in ADDRESS_FAMILIES:
            raise ConfigError(f"{key}.addressFamily", f"expected ipv4 or ipv6 (whose default gateway), got {fam!r}")
        family, address = ADDRESS_FAMILIES[fam], DEFAULT_GATEWAY
    else:
        if "addressFamily" in v:
            raise ConfigError(f"{key}.addressFamily", f"only with address: {DEFAULT_GATEWAY} (an address names "
                                                      "its family)")
        try:
            address = _ip(f"{key}.address", v["address"])
        except ConfigError:
            raise ConfigError(f"{key}.address", f"expected an IP address or {DEFAULT_GATEWAY}, "
                                                f"got {v['address']!r}") from None
    return BgpPeer(address=address, asn=_typed(int, f"{key}.asn", v["asn"], 1, MAX_ASN), password=password,
                   hold_time=_hold_time(f"{key}.holdTime", v.get("holdTime", DEFAULT_HOLD_TIME)),
                   address_family=family)


def _bgp(key: str, v: Any) -> BgpConfig:
    _section(key, v, BGP_KEYS, "a mapping (localASN, peers, ...)")
    if "localASN" not in v:
        raise ConfigError(f"{key}.localASN", "missing")
    local_asn = _typed(int, f"{key}.localASN", v["localASN"], 1, MAX_ASN)
    peers_in = v.get("peers")
    if not isinstance(peers_in, list) or not peers_in:
        raise ConfigError(f"{key}.peers", f"expected a non-empty list of peers, got {peers_in!r}")
    peers = tuple(_bgp_peer(f"{key}.peers[{i}]", p) for i, p in enumerate(peers_in))
    seen: set[str] = set()
    for i, p in enumerate(peers):
        ident = f"{p.address} ipv{p.address_family}" if p.default_gateway else p.address
        if ident in seen:
            raise ConfigError(f"{key}.peers[{i}].address", f"{ident} is listed twice")
        seen.add(ident)
    d = BgpConfig(local_asn=local_asn, peers=peers)  # the defaults of the keys left out
    router_id = _ip(f"{key}.routerID", v["routerID"], 4) if v.get("routerID") is not None else d.router_id
    prefixes = _cidrs(f"{key}.prefixes", v["prefixes"], False) if v.get("prefixes") is not None else d.prefixes
    # a 12-bit field (RFC 4724)
    gr = _typed(int, f"{key}.gracefulRestart", v.get("gracefulRestart", d.graceful_restart), 0, 4095)
    run_dir = _typed(str, f"{key}.runDir", v["runDir"]) if v.get("runDir") is not None else d.run_dir
    return replace(d, router_id=router_id, prefixes=prefixes, graceful_restart=gr, run_dir=run_dir)


WG_KEYS = {"port", "interface", "implementation", "userspaceCommand", "runDir", "keyDir", "rotationPeriod",
            "rotationLead", "persistentKeepalive", "startUserspace"}


def _seconds(key: str, v: Any, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise ConfigError(key, f"expected seconds in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _wireguard(key: str, v: Any) -> WireGuardConfig:
    _section(key, v, WG_KEYS, "a mapping (port, interface, ...)")
    g = v.get
    d = WireGuardConfig()
    period = g("rotationPeriod", d.rotation_period)
    if period != 0:
        period = _seconds(f"{key}.rotationPeriod", period, 10, 365 * 86400)
    return WireGuardConfig(
        port=_typed(int, f"{key}.port", g("port", d.port), 1, 65535),
        interface=_ifname(f"{key}.interface", g("interface", d.interface)),
        implementation=_choice(f"{key}.implementation", g("implementation", d.implementation), WG_IMPLEMENTATIONS),
        userspace_command=_typed(str, f"{key}.userspaceCommand", g("userspaceCommand", d.userspace_command)),
        run_dir=_abspath(f"{key}.runDir", g("runDir", d.run_dir)),
        key_dir=_abspath(f"{key}.keyDir", g("keyDir", d.key_dir)),
        rotation_period=float(period),
        rotation_lead=_seconds(f"{key}.rotationLead", g("rotationLead", d.rotation_lead), 0, 600),
        persistent_keepalive=_typed(int, f"{key}.persistentKeepalive", g("persistentKeepalive", d.persistent_keepalive),
                                  0, 65535),
        start_userspace=_typed(bool, f"{key}.startUserspace", g("startUserspace", d.start_userspace)),
    )


# Every top-level key (and each section's, above): the Helm chart's values.schema.json names the same
# (tests/ship/test_helm_chart.py holds them equal).
KEYS = {
    "nodeName", "trafficEncapMode", "tunnelType", "tunnelPort", "transportInterface",
    "transportInterfaceCIDRs", "noSNAT", "defaultMTU", "bridge", "datapathType", "ovsdb", "ovsRunDir",
    "stateFile", "podCIDRs", "clusterCIDRs", "nodeSource", "fastPath", "macSource", "resyncSeconds",
    "logFile", "bgp", "serviceCIDRs", "networkPolicy", "ovsDaemons", "ovsDatabase", "ovsLogDir",
    "transportVLAN", "trafficEncryptionMode", WG_SECTION, DENIED_LOG_SECTION, "policyPeers",
}


def _denied_log(key: str, v: Any) -> DeniedLogConfig:
    _section(key, v, DENIED_LOG_KEYS, "a mapping (enabled, rate, burst)")
    d = DeniedLogConfig()
    return DeniedLogConfig(enabled=_typed(bool, f"{key}.enabled", v.get("enabled", d.enabled)),
                           rate=_typed(int, f"{key}.rate", v.get("rate", d.rate), 1, 10_000),
                           burst=_typed(int, f"{key}.burst", v.get("burst", d.burst), 1, 100_000))


def from_dict(raw: Any, environ: Mapping[str, str] | None = None) -> Config:
    """Validate a parsed YAML document; :class:`ConfigError` names the first bad key.

    ``nodeName`` defaults to ``$NODE_NAME`` (the DaemonSet sets it from ``spec.nodeName``: a Node's
    name need not be its host name), then to the host name."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError("<root>", "expected a mapping of keys to values")
    for k in raw:
        if k not in KEYS:
            raise ConfigError(str(k), "unknown key")
    g = raw.get
    env = os.environ if environ is None else environ
    if g("nodeName") is not None:
        node_name = _typed(str, "nodeName", g("nodeName"))
    else:
        node_name = env.get("NODE_NAME") or socket.gethostname()
    if len(node_name) > 253 or "/" in node_name or node_name.startswith("."):
        raise ConfigError("nodeName", f"not a valid Node name: {node_name!r}")
    d = Config(node_name=node_name)  # every default, declared once: on the dataclass's fields
    mode = _choice("trafficEncapMode", g("trafficEncapMode", d.mode), MODES)
    datapath = _choice("datapathType", g("datapathType", d.datapath_type), DATAPATHS)
    tunnel_type = _choice("tunnelType", g("tunnelType", d.tunnel_type), TUNNEL_TYPES)
    if tunnel_type == STT and datapath == NETDEV:
        raise ConfigError("tunnelType", "stt is not supported by the netdev (userspace) datapath; "
                          "use vxlan, geneve or gre, or datapathType system")
    default_port = DEFAULT_TUNNEL_PORTS[tunnel_type]
    if g("tunnelPort") is not None:
        if tunnel_type == GRE:
            raise ConfigError("tunnelPort", "gre has no UDP port")
        tunnel_port: int | None = _typed(int, "tunnelPort", g("tunnelPort"), 1, 65535)
    else:
        tunnel_port = default_port
    no_snat = _typed(bool, "noSNAT", g("noSNAT", d.no_snat))
    if no_snat and mode != NO_ENCAP:
        raise ConfigError("noSNAT", f"only valid with trafficEncapMode noEncap (mode is {mode})")
    encryption = _choice("trafficEncryptionMode", g("trafficEncryptionMode", d.encryption), ENCRYPTIONS)
    if encryption != ENCRYPTION_NONE and mode == NETWORK_POLICY_ONLY:
        raise ConfigError("trafficEncryptionMode", "not valid with trafficEncapMode networkPolicyOnly (the primary "
                          "CNI carries Pod traffic between Nodes; encrypt there)")
    if g(WG_SECTION) is not None and encryption != ENCRYPTION_WIREGUARD:
        raise ConfigError(WG_SECTION, f"only valid with trafficEncryptionMode {ENCRYPTION_WIREGUARD}")
    fast_path = _typed(bool, "fastPath", g("fastPath", d.fast_path))
    if fast_path and mode not in FAST_PATH_MODES:
        raise ConfigError("fastPath", f"only valid with trafficEncapMode noEncap or hybrid (mode is {mode})")
    default_mtu = g("defaultMTU", d.default_mtu)
    if default_mtu != 0:
        default_mtu = _typed(int, "defaultMTU", default_mtu, 68, 65535)
    node_source = _node_source("nodeSource", g("nodeSource", {}))  # {}: NodeSourceConfig's defaults
    network_policy = _typed(bool, "networkPolicy", g("networkPolicy", d.network_policy))
    policy_peers = _choice("policyPeers", g("policyPeers", d.policy_peers), POLICY_PEERS)
    if policy_peers == PEERS_SLICES and (node_source.type != "kubernetes" or not network_policy):
        raise ConfigError("policyPeers", f"{PEERS_SLICES} only with nodeSource type kubernetes and networkPolicy "
                                         f"true (nodeSource type is {node_source.type}, networkPolicy "
                                         f"{str(network_policy).lower()})")
    resync = g("resyncSeconds", d.resync_seconds)
    if isinstance(resync, bool) or not isinstance(resync, (int, float)) or not 0.1 <= resync <= 86400:
        raise ConfigError("resyncSeconds", f"expected seconds in [0.1, 86400], got {resync!r}")
    return replace(
        d,
        mode=mode,
        tunnel_type=tunnel_type,
        tunnel_port=tunnel_port,
        transport_interface=_ifname("transportInterface", g("transportInterface", d.transport_interface)),
        transport_interface_cidrs=_cidrs("transportInterfaceCIDRs",
                                         g("transportInterfaceCIDRs", list(d.transport_interface_cidrs)), True),
        transport_vlan=vlan_id("transportVLAN", g("transportVLAN")) if g("transportVLAN") is not None
        else d.transport_vlan,
        no_snat=no_snat,
        default_mtu=default_mtu,
        bridge=_ifname("bridge", g("bridge", d.bridge)),
        datapath_type=datapath,
        ovsdb=_ovsdb("ovsdb", g("ovsdb", d.ovsdb)),
        ovs_run_dir=_typed(str, "ovsRunDir", g("ovsRunDir", d.ovs_run_dir)),
        state_file=_typed(str, "stateFile", g("stateFile", d.state_file)),
        pod_cidrs=_cidrs("podCIDRs", g("podCIDRs", list(d.pod_cidrs)), False),
        cluster_cidrs=_cidrs("clusterCIDRs", g("clusterCIDRs", list(d.cluster_cidrs)), False),
        node_source=node_source,
        fast_path=fast_path,
        mac_source=_choice("macSource", g("macSource", d.mac_source), MAC_SOURCES),
        resync_seconds=float(resync),
        log_file=_typed(str, "logFile", g("logFile")) if g("logFile") is not None else d.log_file,
        bgp=_bgp("bgp", g("bgp")) if g("bgp") is not None else d.bgp,
        network_policy=network_policy,
        policy_peers=policy_peers,
        service_cidrs=_cidrs("serviceCIDRs", g("serviceCIDRs", list(d.service_cidrs)), False),
        denied_log=_denied_log(DENIED_LOG_SECTION, {} if g(DENIED_LOG_SECTION) is None else g(DENIED_LOG_SECTION)),
        ovs_daemons=_choice("ovsDaemons", g("ovsDaemons", d.ovs_daemons), OVS_DAEMONS),
        ovs_database=_abspath("ovsDatabase", g("ovsDatabase", d.ovs_database)),
        ovs_log_dir=_abspath("ovsLogDir", g("ovsLogDir", d.ovs_log_dir)),
        encryption=encryption,
        wireguard=_wireguard(WG_SECTION, g(WG_SECTION)) if g(WG_SECTION) is not None else d.wireguard,
    )


def load(path: str = DEFAULT_CONFIG_FILE) -> Config:
    """Read and validate a YAML config file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError("<file>", f"{path} does not exist") from None
    except OSError as e:
        raise ConfigError("<file>", f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError("<file>", f"{path} is not valid YAML ({e})") from None
    return from_dict(raw)
