"""The node state file: what route-sync tells the plugin about this Node.

route-sync is its only writer (atomic rename); the plugin reads it on every ADD. JSON, because
the plugin parses it per Pod and ``json`` is in the standard library (yaml costs ~20 ms to
import).  The schema is versioned: a reader refuses a file whose ``version`` it does not know.

    {
      "version": 1,
      "node": "node-a",
      "mode": "encap",                    # cni.pipeline.modes: encap | noEncap | hybrid | networkPolicyOnly
      "bridge": "br-int",
      "datapath": "netdev",               # netdev | system
      "ovsdb": "unix:/run/openvswitch/db.sock",
      "ovsRunDir": "/run/openvswitch",    # where <bridge>.mgmt lives (for ovs-ofctl)
      "mtu": 1450,                        # tunnel MTU (transport MTU minus tunnel overhead)
      "transportMTU": 1500,               # the underlay's: Pods' interfaces, unencapsulated paths;
                                          # absent/0 (older route-sync): one MTU, "mtu", for all
      "podCIDRs": ["10.244.1.0/24", "fd00:10:244:1::/64"],
      "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/48"],
      "gateway": {"name": "ferry-gw0", "mac": "..", "ofport": 2,
                  "addresses": ["10.244.1.1/24", "fd00:10:244:1::1/64"]},
      "tunnel": {"type": "vxlan", "port": "ferry-tun0", "ofport": 3} | null,
      "peers": [{"name": "node-b", "addresses": ["192.168.77.2"],
                 "podCIDRs": ["10.244.2.0/24"], "path": "tunnel", "mac": null}],
      "encryption": "none",               # none | wireguard (every peer's path then; absent: none)
      "policyNamespaces": ["prod"]        # namespaces that have a NetworkPolicy: a Pod ADDed
                                          # there starts pending (no new connection) until
                                          # route-sync has its policy in force; absent: none
    }
"""

from __future__ import annotations

import os

from cni.lean import fastjson
from cni.lean.record import Factory, as_dict, record
from cni.lean.typecheck import TYPE_CHECKING
from cni.pipeline.modes import ENCRYPTION_NONE, is_encryption, is_mode, is_path

if TYPE_CHECKING:
    from typing import Any, TypeVar

    from cni.pipeline.modes import Encryption, Mode, Path

    T = TypeVar("T")

SCHEMA_VERSION = 1
DEFAULT_STATE_FILE = "/var/run/ferry/node-state.json"


class StateError(Exception):
    """The state file is absent, unreadable, of another version, or malformed."""


class StateMissing(StateError):
    """The state file is not there (yet): route-sync has not written it since the Node started."""


@record(frozen=True)
class Gateway:
    name: str
    mac: str
    ofport: int
    addresses: list[str]  # CIDR notation: "10.244.1.1/24"


@record(frozen=True)
class Tunnel:
    type: str
    port: str
    ofport: int


@record(frozen=True)
class Peer:
    name: str
    addresses: list[str]
    podCIDRs: list[str]
    path: Path
    mac: str | None = None
    macSource: str | None = None


@record(frozen=True)
class NodeState:
    node: str
    mode: Mode
    bridge: str
    datapath: str
    ovsdb: str
    ovsRunDir: str
    mtu: int
    podCIDRs: list[str]
    gateway: Gateway
    clusterCIDRs: list[str] = Factory(list)
    tunnel: Tunnel | None = None
    peers: list[Peer] = Factory(list)
    transportMTU: int = 0  # 0: not given (a route-sync before per-path MTUs): "mtu" everywhere
    policyNamespaces: list[str] = Factory(list)
    # cni.pipeline.modes' encryption words; wireguard: every peer's path is (the Pods' routes to
    # other Nodes carry "mtu", WireGuard's, in every mode)
    encryption: Encryption = ENCRYPTION_NONE
    version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json_text(self)


def json_text(obj: Any) -> str:
    """A record as the state file spells it (:meth:`NodeState.to_json`; route-sync also keeps
    each peer row's part between writes)."""
    import json  # route-sync writes the file; the plugin only parses it

    # One line: indent= makes json fall back to its pure-Python encoder (~12x slower: 36 ms at
    # 1,000 peers); `ferry-route-sync show` is the way to read it.
    return json.dumps(as_dict(obj), sort_keys=True, separators=(",", ":"))


def _require(d: dict[str, Any], key: str, kind: type[T], where: str, default: Any = fastjson.REQUIRED,
             falsy_default: bool = False) -> T:
    try:
        return fastjson.field(d, key, kind, default, falsy_default=falsy_default)
    except fastjson.FieldError as e:
        raise StateError(f"{where}: missing key {key!r}" if e.missing
                         else f"{where}: key {key!r} has the wrong type") from None


def parse(text: str | bytes, where: str = "node state") -> NodeState:
    try:
        d = fastjson.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise StateError(f"{where}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise StateError(f"{where}: not a JSON object")
    version = _require(d, "version", int, where)
    if version != SCHEMA_VERSION:
        raise StateError(f"{where}: schema version {version}, this Ferry reads {SCHEMA_VERSION}")
    mode = _require(d, "mode", str, where)
    if not is_mode(mode):
        raise StateError(f"{where}: unknown mode {mode!r}")
    gw = _require(d, "gateway", dict, where)
    gateway = Gateway(
        name=_require(gw, "name", str, where + ".gateway"),
        mac=_require(gw, "mac", str, where + ".gateway"),
        ofport=_require(gw, "ofport", int, where + ".gateway"),
        addresses=[str(a) for a in _require(gw, "addresses", list, where + ".gateway")],
    )
    tunnel = None
    if d.get("tunnel") is not None:
        t = _require(d, "tunnel", dict, where)
        tunnel = Tunnel(type=_require(t, "type", str, where + ".tunnel"),
                        port=_require(t, "port", str, where + ".tunnel"),
                        ofport=_require(t, "ofport", int, where + ".tunnel"))
    peers = []
    for i, p in enumerate(_require(d, "peers", list, where, [], falsy_default=True)):
        w = f"{where}.peers[{i}]"
        if not isinstance(p, dict):
            raise StateError(f"{w}: not an object")
        path = _require(p, "path", str, w)
        if not is_path(path):
            raise StateError(f"{w}: unknown path {path!r}")
        peers.append(Peer(name=_require(p, "name", str, w),
                          addresses=[str(a) for a in _require(p, "addresses", list, w)],
                          podCIDRs=[str(c) for c in _require(p, "podCIDRs", list, w)],
                          path=path, mac=p.get("mac"), macSource=p.get("macSource")))
    mtu = _require(d, "mtu", int, where)
    if not 68 <= mtu <= 65535:
        raise StateError(f"{where}: mtu {mtu} out of range")
    transport_mtu = d.get("transportMTU") or 0
    if not isinstance(transport_mtu, int) or isinstance(transport_mtu, bool) or \
            not (transport_mtu == 0 or 68 <= transport_mtu <= 65535):
        raise StateError(f"{where}: transportMTU {transport_mtu!r} out of range")
    policy_namespaces = d.get("policyNamespaces") or []
    if not isinstance(policy_namespaces, list) or not all(isinstance(n, str) for n in policy_namespaces):
        raise StateError(f"{where}: key 'policyNamespaces' is not a list of names")
    encryption = d.get("encryption") or ENCRYPTION_NONE
    if not is_encryption(encryption):
        raise StateError(f"{where}: unknown encryption {encryption!r}")
    return NodeState(
        node=_require(d, "node", str, where),
        mode=mode,
        bridge=_require(d, "bridge", str, where),
        datapath=_require(d, "datapath", str, where),
        ovsdb=_require(d, "ovsdb", str, where),
        ovsRunDir=_require(d, "ovsRunDir", str, where),
        mtu=mtu,
        podCIDRs=[str(c) for c in _require(d, "podCIDRs", list, where)],
        clusterCIDRs=[str(c) for c in _require(d, "clusterCIDRs", list, where, [], falsy_default=True)],
        gateway=gateway,
        tunnel=tunnel,
        peers=peers,
        transportMTU=transport_mtu,
        policyNamespaces=list(policy_namespaces),
        encryption=encryption,
    )


def read(path: str = DEFAULT_STATE_FILE) -> NodeState:
    """Read and validate the state file; :class:`StateError` when absent or invalid."""
    try:
        with open(path, "rb") as f:
            return parse(f.read(), where=path)
    except FileNotFoundError:
        raise StateMissing(f"{path}: node state not written yet (is ferry-route-sync running?)") from None
    except OSError as e:
        raise StateError(f"{path}: {e.strerror}") from None


def write(state: NodeState, path: str = DEFAULT_STATE_FILE) -> None:
    """Atomically replace the state file (temp file, fsync, rename, fsync the directory)."""
    write_text(state.to_json(), path)


def write_text(text: str, path: str = DEFAULT_STATE_FILE) -> None:
    """:func:`write` of a state already in its JSON text (``NodeState.to_json``'s; route-sync
    keeps the per-peer parts of it between writes)."""
    from cni.node.atomicfile import write_atomic  # route-sync writes; the plugin only reads

    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    write_atomic(path, text.encode())
