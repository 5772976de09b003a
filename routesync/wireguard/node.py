"""This Node's WireGuard between passes: its keys on disk, the plan of each pass, what it tells
the log and ``show``.  The loop's seam (:class:`.loop.WireGuardLoop`, ``trafficEncryptionMode:
wireguard``) holds one and asks it

* :meth:`WireGuardNode.plan_for` in each pass (the keys, the time: :mod:`.plan`),
* :meth:`WireGuardNode.spec` for the appliers (``DesiredState.wireguard``),
* :meth:`WireGuardNode.applied` once the pass is applied (a switched rotation is finished on disk,
  refusals logged when they start, the status file ``show`` reads written when it changes),
* :meth:`WireGuardNode.due` between passes (a ``rotate-key`` waiting, a switch time reached, the
  rotation period over)."""

from __future__ import annotations

import ipaddress
import json
import logging
import os
from collections.abc import Mapping, Sequence

from cni.node.atomicfile import write_atomic
from routesync.config import Config
from routesync.model import NodeRecord

from . import keys
from .model import NEXT_KEY_ANNOTATION, SWITCH_AT_ANNOTATION, WgSpec
from .plan import Refused, WgPlan, plan

log = logging.getLogger(__name__)

STATUS_FILE = "wireguard.json"  # beside the node state file


def status_path(state_file: str) -> str:
    return os.path.join(os.path.dirname(state_file) or ".", STATUS_FILE)


def host_addresses(gateway_cidrs: Sequence[str]) -> tuple[str, ...]:
    """The gateway's addresses as host routes' sources on the device: ``10.244.1.1/32``."""
    out = []
    for c in gateway_cidrs:
        ip = ipaddress.ip_interface(c).ip
        out.append(f"{ip}/{ip.max_prefixlen}")
    return tuple(sorted(out))


class WireGuardNode:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.wg = config.wireguard
        self.last: WgPlan | None = None
        self._refused: set[Refused] = set()
        self._waiting: set[str] = set()
        self._status: dict | None = None

    def plan_for(self, local: NodeRecord, peers: Sequence[NodeRecord], now: float) -> WgPlan:
        old = bool(self.wg.rotation_period) and keys.age(self.wg.key_dir, now) >= self.wg.rotation_period
        if old and keys.start_rotation(self.wg.key_dir):
            log.info("WireGuard: the key is %.0f s old (rotationPeriod %.0f s): rotating",
                         keys.age(self.wg.key_dir, now), self.wg.rotation_period)
        local_keys = keys.local_keys(self.wg.key_dir, now, self.wg.rotation_lead)
        return plan(self.wg.interface, self.wg.port, local, peers, local_keys, now, self.wg.persistent_keepalive)

    def plan_ahead(self, local: NodeRecord, peers: Sequence[NodeRecord], wg: WgPlan) -> tuple[float, WgPlan] | None:
        """The plan of the instant ``wg`` changes by itself (a rotation's switch), computed now, so
        that at that instant only its difference is applied (:meth:`.loop.WireGuardLoop.tick`): every Node
        switches within a millisecond or two of the time, not a pass later."""
        if wg.wake_at is None:
            return None
        local_keys = keys.local_keys(self.wg.key_dir, wg.wake_at, self.wg.rotation_lead)
        return wg.wake_at, plan(self.wg.interface, self.wg.port, local, peers, local_keys, wg.wake_at,
                                self.wg.persistent_keepalive)

    def spec(self, wg: WgPlan, gateway_cidrs: Sequence[str], mtu: int) -> WgSpec:
        return WgSpec(device=wg.device, addresses=host_addresses(gateway_cidrs), mtu=mtu)

    def applied(self, wg: WgPlan, implementation: str | None, peer_names: dict[str, str],
                replaced: Mapping[str, str] | None = None) -> None:
        """After the pass that applied ``wg``.  ``peer_names``: public key → Node; ``replaced``:
        Node → the path its mode would give it without encryption (both for show)."""
        if wg.promote and keys.finish_rotation(self.wg.key_dir):
            log.info("WireGuard: switched to the next key (public %s)", wg.public_key)
        now = set(wg.refused)
        for r in sorted(now - self._refused, key=repr):
            log.warning("WireGuard: peer %s refused (no traffic to or from it): %s", r.peer, r.reason)
        for r in sorted(self._refused - now, key=repr):
            log.info("WireGuard: peer %s accepted again", r.peer)
        self._refused = now
        waiting = set(wg.waiting)
        for n in sorted(waiting - self._waiting):
            log.warning("WireGuard: peer %s has published no public key yet (its Pods are unreachable until it does; "
                        "nothing is sent to it in clear)", n)
        for n in sorted(self._waiting - waiting):
            log.info("WireGuard: peer %s published its key", n)
        self._waiting = waiting
        self.last = wg
        status = {
            "implementation": implementation, "interface": wg.device.name, "listenPort": wg.device.listen_port,
            "publicKey": wg.public_key, "rotating": dict(wg.publish).get(SWITCH_AT_ANNOTATION),
            "refused": [{"node": r.peer, "reason": r.reason} for r in wg.refused],
            "waiting": list(wg.waiting),
            "replaces": dict(sorted((replaced or {}).items())),
            "peers": [{"node": peer_names.get(p.public_key, "?"), "publicKey": p.public_key, "endpoint": p.endpoint,
                       "allowedIPs": list(p.allowed_ips)} for p in wg.device.peers],
        }
        if status != self._status:
            try:
                os.makedirs(os.path.dirname(status_path(self.config.state_file)), exist_ok=True)
                write_atomic(status_path(self.config.state_file), json.dumps(status, indent=1, sort_keys=True).encode())
                self._status = status
            except OSError as e:
                log.warning("WireGuard status for show not written: %s", e)

    def due(self, now: float) -> bool:
        """A pass is needed for WireGuard's own sake: a switch time reached, a ``rotate-key``
        waiting to be announced, or the rotation period over."""
        last = self.last
        if last is None:
            return False
        if last.wake_at is not None and now >= last.wake_at:
            return True
        announced = dict(last.publish).get(NEXT_KEY_ANNOTATION) is not None
        if not announced and keys.read(self.wg.key_dir, keys.NEXT) is not None:
            return True
        return bool(self.wg.rotation_period and keys.age(self.wg.key_dir, now) >= self.wg.rotation_period)

    def wake_at(self) -> float | None:
        return self.last.wake_at if self.last is not None else None
