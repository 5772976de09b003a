"""Ferry IPAM, in process: what the ``ferry`` plugin calls on ADD/DEL/CHECK/GC/STATUS.

    conf = parse_config(netconf, node_cidrs)          # CniError 7 (bad ranges) / 11 (no CIDRs yet)
    ips = allocate(conf, container_id, ifname, requested=("10.244.1.9",))
    release(conf, container_id, ifname)
    check(conf, container_id, ifname, ["10.244.1.9/24"])
    released = gc(conf, {(container_id, ifname), ...})
    status(conf)                                       # CniError 50 when ADD cannot be served

One address per range set (i.e. per family) per attachment; ``allocate`` is idempotent."""

from __future__ import annotations

import os

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

from cni.ipam.allocator import Pick, match_requested, parse_cursor, pick_free
from cni.ipam.ranges import RangeSet, fmt, parse_address, parse_range_sets, range_sets_from_cidrs
from cni.ipam.store import Key, Record, Store, StoredIP
from cni.lean import addr
from cni.lean.record import record
from cni.spec.errors import (
    INVALID_CONFIG,
    INVALID_ENV,
    IPAM_FAILURE,
    NOT_READY,
    TRY_AGAIN_LATER,
    CniError,
)
from cni.spec.result import IPConfig, Route

DEFAULT_DATA_DIR = "/var/lib/ferry/ipam"


@record(frozen=True)
class IpamConfig:
    network: str
    data_dir: str
    range_sets: tuple[RangeSet, ...]
    routes: tuple[Route, ...] = ()
    durable: bool = False  # fsync every write (survive power loss), not only process crashes

    @property
    def store_dir(self) -> str:
        return os.path.join(self.data_dir, self.network)


def _parse_routes(obj: Any) -> tuple[Route, ...]:
    if obj is None:
        return ()
    if not isinstance(obj, list):
        raise CniError(INVALID_CONFIG, "ipam.routes: must be a list")
    out = []
    for i, r in enumerate(obj):
        if not isinstance(r, dict) or not isinstance(r.get("dst"), str):
            raise CniError(INVALID_CONFIG, f"ipam.routes[{i}].dst: missing")
        gw = r.get("gw", "") or ""
        try:
            addr.parse_interface(r["dst"])
            if gw:
                addr.parse_ip(gw)
        except ValueError as e:
            raise CniError(INVALID_CONFIG, f"ipam.routes[{i}]: {e}") from None
        out.append(Route(dst=r["dst"], gw=gw))
    return tuple(out)


def parse_config(netconf: dict[str, Any], node_cidrs: list[str]) -> IpamConfig:
    """The IPAM part of a network config.  Explicit ``ipam.ranges`` win; without them one range
    set per Node Pod CIDR; with neither, ``CniError(11)``: route-sync has not written them yet."""
    if not isinstance(netconf, dict):
        raise CniError(INVALID_CONFIG, "network config must be an object")
    name = netconf.get("name")
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name:
        raise CniError(INVALID_CONFIG, f"name: {name!r} is not a usable network name")
    ipam = netconf.get("ipam")
    if ipam is None:
        ipam = {}
    if not isinstance(ipam, dict):
        raise CniError(INVALID_CONFIG, "ipam: must be an object")
    data_dir = ipam.get("dataDir") or DEFAULT_DATA_DIR
    if not isinstance(data_dir, str) or not os.path.isabs(data_dir):
        raise CniError(INVALID_CONFIG, f"ipam.dataDir: {data_dir!r} must be an absolute path")
    if "ranges" in ipam and ipam["ranges"] is not None:
        range_sets = parse_range_sets(ipam["ranges"], "ipam.ranges")
    elif node_cidrs:
        range_sets = range_sets_from_cidrs(node_cidrs, "node podCIDRs")
    else:
        raise CniError(TRY_AGAIN_LATER, "ipam: no ipam.ranges and the Node has no Pod CIDRs yet "
                                        "(has ferry-route-sync written the node state?)")
    durable = ipam.get("durable", False)
    if not isinstance(durable, bool):
        raise CniError(INVALID_CONFIG, "ipam.durable: must be true or false")
    return IpamConfig(network=name, data_dir=data_dir, range_sets=range_sets,
                      routes=_parse_routes(ipam.get("routes")), durable=durable)


def _key(container_id: str, ifname: str) -> Key:
    if not container_id or not ifname:
        raise CniError(INVALID_ENV, "ipam: container ID and ifname are required")
    return (container_id, ifname)


def _to_result(record: Record) -> list[IPConfig]:
    return [IPConfig(address=i.address, gateway=i.gateway) for i in record.ips]


def _same_ip(a: str, b: str) -> bool:
    try:
        return parse_address(a) == parse_address(b)
    except ValueError:
        return False


def allocate(conf: IpamConfig, container_id: str, ifname: str,
             requested: Sequence[str] = ()) -> list[IPConfig]:
    """One address per range set for the attachment; the same ones again if it already has them.
    Nothing is reserved unless every range set could give one (one journaled commit)."""
    key = _key(container_id, ifname)
    wanted = match_requested(conf.range_sets, requested)
    with Store(conf.store_dir, conf.durable).locked() as txn:
        existing = txn.get(key)
        if existing is not None:
            for pick in wanted.values():
                if not any(_same_ip(pick.text, i.ip) for i in existing.ips):
                    raise CniError(IPAM_FAILURE, f"{container_id}/{ifname} already holds "
                                                 f"{', '.join(i.address for i in existing.ips)}, "
                                                 f"not the requested {pick.text}")
            return _to_result(existing)
        picks: list[Pick] = []
        cursors: dict[int, str] = {}
        for index, range_set in enumerate(conf.range_sets):
            bits = range_set[0].bits
            if index in wanted:
                pick = wanted[index]
                if txn.taken(pick.text):
                    owner = txn.owner(pick.text)
                    who = f"{owner[0]}/{owner[1]}" if owner else "another attachment"
                    raise CniError(IPAM_FAILURE, f"requested address {pick.text} is already in use by {who}")
            else:
                pick = pick_free(index, range_set, parse_cursor(txn.cursor(index), range_set),
                                 lambda a, b: txn.taken(fmt(a, b)))
                cursors[index] = pick.text
            assert pick.range.bits == bits
            picks.append(pick)
        record = Record(container_id, ifname, tuple(
            StoredIP(p.range.cidr(p.addr), fmt(p.range.gateway, p.range.bits)) for p in picks))
        txn.add(record, cursors)
        return _to_result(record)


def release_config(netconf: dict[str, Any]) -> IpamConfig:
    """Enough of the config to release by (container ID, ifname) when no ranges are known (the
    node state is gone): releasing needs the store, not the ranges."""
    try:
        return parse_config(netconf, [])
    except CniError as e:
        if e.code != TRY_AGAIN_LATER:
            raise
    ipam = netconf.get("ipam") or {}
    data_dir = ipam.get("dataDir") or DEFAULT_DATA_DIR
    return IpamConfig(network=netconf["name"], data_dir=data_dir, range_sets=(),
                      durable=bool(ipam.get("durable", False)))


def release(conf: IpamConfig, container_id: str, ifname: str) -> None:
    """Free the attachment's addresses; an unknown attachment is already released."""
    key = _key(container_id, ifname)
    with Store(conf.store_dir, conf.durable).locked() as txn:
        record = txn.get(key)
        if record is not None:
            txn.delete(record)


def check(conf: IpamConfig, container_id: str, ifname: str, addresses: list[str]) -> None:
    """Each address (CIDR or plain) must be held by this attachment; CniError naming the first
    that is not."""
    key = _key(container_id, ifname)
    with Store(conf.store_dir, conf.durable).locked() as txn:
        record = txn.get(key)
        held = record.ips if record else ()
        for a in addresses:
            if not any(_same_ip(a, i.ip) for i in held):
                raise CniError(IPAM_FAILURE, f"address {a} is not allocated to {container_id}/{ifname}")
            if txn.owner(str(a).split("/", 1)[0].strip()) != key:
                raise CniError(IPAM_FAILURE, f"address {a} of {container_id}/{ifname} is not claimed "
                                             f"in the store")


def gc(conf: IpamConfig, valid: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """Release every attachment not in ``valid``; returns the released keys (and logs them)."""
    released: list[tuple[str, str]] = []
    with Store(conf.store_dir, conf.durable).locked() as txn:
        for record in list(txn.records()):
            if record.key not in valid:
                txn.delete(record)
                released.append(record.key)
    if released:
        import logging

        log = logging.getLogger("ferry.ipam")
        for cid, ifname in released:
            log.info("gc: released %s/%s from network %s", cid, ifname, conf.network)
    return released


def status(conf: IpamConfig) -> None:
    """``CniError(50)`` when an ADD could not be served now: no range, store not writable, or a
    range set without a free address (an ADD needs one from every set)."""
    if not conf.range_sets:
        raise CniError(NOT_READY, "ipam: no address range configured")
    try:
        with Store(conf.store_dir, conf.durable).locked() as txn:
            if not os.access(conf.store_dir, os.W_OK):
                raise CniError(NOT_READY, f"ipam: store {conf.store_dir} is not writable")
            for index, range_set in enumerate(conf.range_sets):
                pick_free(index, range_set, parse_cursor(txn.cursor(index), range_set),
                          lambda a, b: txn.taken(fmt(a, b)))
    except CniError as e:
        if e.code == NOT_READY:
            raise
        raise CniError(NOT_READY, f"ipam cannot serve ADD: {e.msg}") from None


def list_allocations(data_dir: str) -> list[dict[str, Any]]:
    """Every allocation under ``data_dir`` (all networks), for ``ferry-ipam ls``."""
    out: list[dict[str, Any]] = []
    try:
        networks = sorted(os.listdir(data_dir))
    except FileNotFoundError:
        return out
    for network in networks:
        path = os.path.join(data_dir, network)
        if not os.path.isdir(os.path.join(path, "attachments")) or os.path.islink(path):
            continue
        with Store(path).locked() as txn:
            for record in txn.records():
                for ip in record.ips:
                    out.append({"network": network, "containerID": record.container_id,
                                "ifname": record.ifname, "address": ip.address, "gateway": ip.gateway})
    return out
