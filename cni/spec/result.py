"""CNI results as plain data, encoded in the shape of the version the config asks for.

0.3.0, 0.3.1 and 0.4.0 tag each IP with ``"version": "4"|"6"``; 1.0.0 and 1.1.0 drop that tag;
1.1.0 adds the interface ``mtu``.  ``decode`` reads any of these shapes (``prevResult`` in
CHECK/DEL, an IPAM plugin's answer)."""

from __future__ import annotations

from cni.lean.record import Factory, record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any, TypeVar

    T = TypeVar("T")

from cni.lean import addr, fastjson
from cni.spec.errors import DECODE_FAILURE, CniError

SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")


def version_tuple(version: str) -> tuple[int, int, int]:
    parts = version.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a version: {version!r}")
    return (int(parts[0]), int(parts[1]), int(parts[2]))


@record
class Interface:
    name: str
    mac: str = ""
    sandbox: str = ""
    mtu: int = 0


@record
class IPConfig:
    address: str  # CIDR: "10.244.1.5/24"
    gateway: str = ""
    interface: int | None = None  # index into Result.interfaces

    @property
    def family(self) -> int:
        return addr.family(self.address)


@record
class Route:
    dst: str
    gw: str = ""
    mtu: int = 0


@record
class DNS:
    nameservers: list[str] = Factory(list)
    domain: str = ""
    search: list[str] = Factory(list)
    options: list[str] = Factory(list)

@record
class Result:
    interfaces: list[Interface] = Factory(list)
    ips: list[IPConfig] = Factory(list)
    routes: list[Route] = Factory(list)
    dns: DNS = Factory(DNS)

    def left_out(self, cni_version: str) -> list[str]:
        """What :meth:`encode` drops because ``cni_version`` cannot say it (MTUs before 1.1.0)."""
        if version_tuple(cni_version) >= (1, 1, 0):
            return []
        return ([f"interface {i.name} mtu {i.mtu}" for i in self.interfaces if i.mtu]
                + [f"route {r.dst} mtu {r.mtu}" for r in self.routes if r.mtu])

    def encode(self, cni_version: str) -> dict[str, Any]:
        """The result as the JSON object of ``cni_version``."""
        v = version_tuple(cni_version)
        out: dict[str, Any] = {"cniVersion": cni_version}
        if self.interfaces:
            ifaces = []
            for i in self.interfaces:
                d: dict[str, Any] = {"name": i.name}
                if i.mac:
                    d["mac"] = i.mac
                if i.mtu and v >= (1, 1, 0):
                    d["mtu"] = i.mtu
                if i.sandbox:
                    d["sandbox"] = i.sandbox
                ifaces.append(d)
            out["interfaces"] = ifaces
        if self.ips:
            ips = []
            for ip in self.ips:
                d = {}
                if v < (1, 0, 0):
                    d["version"] = str(ip.family)
                if ip.interface is not None:
                    d["interface"] = ip.interface
                d["address"] = ip.address
                if ip.gateway:
                    d["gateway"] = ip.gateway
                ips.append(d)
            out["ips"] = ips
        if self.routes:
            routes = []
            for r in self.routes:
                d = {"dst": r.dst}
                if r.gw:
                    d["gw"] = r.gw
                if r.mtu and v >= (1, 1, 0):
                    d["mtu"] = r.mtu
                routes.append(d)
            out["routes"] = routes
        dns: dict[str, Any] = {}
        if self.dns.nameservers:
            dns["nameservers"] = list(self.dns.nameservers)
        if self.dns.domain:
            dns["domain"] = self.dns.domain
        if self.dns.search:
            dns["search"] = list(self.dns.search)
        if self.dns.options:
            dns["options"] = list(self.dns.options)
        out["dns"] = dns
        return out


def _field(d: dict[str, Any], key: str, kind: type[T], where: str, default: Any = fastjson.REQUIRED,
           falsy_default: bool = False) -> T:
    """``d[key]`` (``default`` when absent), or :class:`CniError` 6 naming the field."""
    try:
        return fastjson.field(d, key, kind, default, falsy_default=falsy_default)
    except fastjson.FieldError as e:
        raise CniError(DECODE_FAILURE, f"{where}: missing {key!r}" if e.missing
                       else f"{where}: {key!r} must be {e.expected}") from None


def decode(obj: Any, where: str = "prevResult") -> Result:
    """Parse a result of any supported version; :class:`CniError` 6 naming the bad field."""
    if not isinstance(obj, dict):
        raise CniError(DECODE_FAILURE, f"{where} must be a JSON object")
    res = Result()
    for n, i in enumerate(_field(obj, "interfaces", list, where, [], falsy_default=True)):
        w = f"{where}.interfaces[{n}]"
        if not isinstance(i, dict):
            raise CniError(DECODE_FAILURE, f"{w} must be an object")
        mtu = i.get("mtu", 0)
        if not isinstance(mtu, int) or isinstance(mtu, bool):
            raise CniError(DECODE_FAILURE, f"{w}.mtu must be an integer")
        res.interfaces.append(Interface(name=_field(i, "name", str, w), mac=_field(i, "mac", str, w, ""),
                                        sandbox=_field(i, "sandbox", str, w, ""), mtu=mtu))
    for n, ip in enumerate(_field(obj, "ips", list, where, [], falsy_default=True)):
        w = f"{where}.ips[{n}]"
        if not isinstance(ip, dict):
            raise CniError(DECODE_FAILURE, f"{w} must be an object")
        address = _field(ip, "address", str, w)
        gateway = _field(ip, "gateway", str, w, "")
        try:
            addr.parse_interface(address)
            if gateway:
                addr.parse_ip(gateway)
        except ValueError as e:
            raise CniError(DECODE_FAILURE, f"{w}: {e}") from None
        index = ip.get("interface")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool) or index < 0
                                  or index >= len(res.interfaces)):
            raise CniError(DECODE_FAILURE, f"{w}.interface must index {where}.interfaces")
        res.ips.append(IPConfig(address=address, gateway=gateway, interface=index))
    for n, r in enumerate(_field(obj, "routes", list, where, [], falsy_default=True)):
        w = f"{where}.routes[{n}]"
        if not isinstance(r, dict):
            raise CniError(DECODE_FAILURE, f"{w} must be an object")
        dst, gw = _field(r, "dst", str, w), _field(r, "gw", str, w, "")
        mtu = r.get("mtu", 0)
        if not isinstance(mtu, int) or isinstance(mtu, bool) or mtu < 0:
            raise CniError(DECODE_FAILURE, f"{w}.mtu must be a non-negative integer")
        try:
            addr.parse_interface(dst)
            if gw:
                addr.parse_ip(gw)
        except ValueError as e:
            raise CniError(DECODE_FAILURE, f"{w}: {e}") from None
        res.routes.append(Route(dst=dst, gw=gw, mtu=mtu))
    dns = obj.get("dns") or {}
    if not isinstance(dns, dict):
        raise CniError(DECODE_FAILURE, f"{where}.dns must be an object")
    dw = f"{where}.dns"
    res.dns = DNS(nameservers=[str(x) for x in _field(dns, "nameservers", list, dw, [], falsy_default=True)],
                  domain=_field(dns, "domain", str, dw, ""),
                  search=[str(x) for x in _field(dns, "search", list, dw, [], falsy_default=True)],
                  options=[str(x) for x in _field(dns, "options", list, dw, [], falsy_default=True)])
    return res
