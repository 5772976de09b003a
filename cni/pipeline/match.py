"""Match fields as typed values: which header field (:class:`FieldSpec`, named as in ovs-fields(7)),
an integer value, and for addresses an optional prefix length.  A flow's match is a tuple of
these and of the protocol shorthands (:data:`IP`, :data:`IPV6`, :data:`ARP`, :data:`ICMP6`,
:data:`TCP`, :data:`UDP6`, ...), which carry the prerequisites (``eth_type``, ``ip_proto``) the
other fields need.

``text()`` renders ovs-ofctl syntax (logs, dumps, tests); :mod:`cni.ovs.openflow.codec` encodes
the same values to OpenFlow bytes without reading that text.  Standard library only, imported on
every ADD/DEL."""

from __future__ import annotations

from cni.lean import addr
from cni.lean.record import record

_HEX = frozenset("0123456789abcdef")
KIND_MAC, KIND_IP, KIND_INT, KIND_HEX = "mac", "ip", "int", "hex"  # how a field's value is written
KIND_CT_STATE = "ct_state"  # conntrack state flags, written +trk+rpl (value/mask)


class FieldSpec:
    """One packet or metadata field OVS can match or set: its names (``set_field`` name, match
    name, NXM name for ``move``/``load``), OXM/NXM header and width.  Singletons (compared by
    identity)."""

    __slots__ = ("header", "kind", "length", "match_name", "name", "nxm", "nxm_header", "order")

    def __init__(self, name: str, header: int, length: int, kind: str, match_name: str = "",
                 nxm: str = "", nxm_header: int = 0) -> None:
        self.name = name
        self.match_name = match_name or name
        self.header = header  # OXM/NXM class << 16 | field << 9 (hasmask bit and length not included)
        self.length = length  # bytes
        self.kind = kind
        self.nxm = nxm  # e.g. "NXM_OF_ETH_DST" (move/load); "" when not spoken there
        self.nxm_header = nxm_header  # that NXM header, length included
        self.order = len(FIELDS)  # OXM order in a match: prerequisites first
        FIELDS[name] = self

    def __call__(self, value: str | int) -> Field:
        """This field = ``value``: an ofport or number, a MAC, or an address or prefix
        (``10.0.0.0/24``, host bits cleared as ovs-ofctl does), validated (ValueError)."""
        if self.kind == KIND_MAC:
            return Field(self, mac_value(str(value)))
        if self.kind == KIND_IP:
            return address(self, str(value))
        v = int(value)
        if not 0 <= v < 1 << (8 * self.length):
            raise ValueError(f"{self.name}={value}: does not fit in {8 * self.length} bits")
        return Field(self, v)

    def format(self, value: int) -> str:
        if self.kind == KIND_MAC:
            return value.to_bytes(6, "big").hex(":")
        if self.kind == KIND_IP:
            return addr.format_ip(value, self.length * 8)
        if self.kind == KIND_HEX:
            return f"0x{value:x}"
        return str(value)

    def __repr__(self) -> str:
        return f"FieldSpec({self.name})"


FIELDS: dict[str, FieldSpec] = {}


def _oxm(field: int) -> int:  # OpenFlow basic class 0x8000
    return (0x8000 << 16) | (field << 9)


def _nxm(cls: int, field: int) -> int:
    return (cls << 16) | (field << 9)


# In OXM order: each field after the fields its prerequisites name.
IN_PORT = FieldSpec("in_port", _oxm(0), 4, KIND_INT)
ETH_DST = FieldSpec("eth_dst", _oxm(3), 6, KIND_MAC, "dl_dst", "NXM_OF_ETH_DST", 0x00000206)
ETH_SRC = FieldSpec("eth_src", _oxm(4), 6, KIND_MAC, "dl_src", "NXM_OF_ETH_SRC", 0x00000406)
ETH_TYPE = FieldSpec("eth_type", _oxm(5), 2, KIND_HEX, "dl_type")
# The 802.1Q VLAN ID as OXM speaks it: the VID with OFPVID_PRESENT (0x1000) set; match and set
# (a tagged transport network, ``vlan_vid``): 4196 is VLAN 100.
VLAN_VID = FieldSpec("vlan_vid", _oxm(6), 2, KIND_INT)
IP_PROTO = FieldSpec("ip_proto", _oxm(10), 1, KIND_INT, "nw_proto")
IPV4_SRC = FieldSpec("ipv4_src", _oxm(11), 4, KIND_IP, "nw_src")
IPV4_DST = FieldSpec("ipv4_dst", _oxm(12), 4, KIND_IP, "nw_dst")
# Transport destination ports: ovs-ofctl reads and prints all three as tp_dst (the protocol
# shorthand, tcp/udp/sctp and their 6 twins, says which); ip_proto is their prerequisite.
TCP_DST = FieldSpec("tcp_dst", _oxm(14), 2, KIND_INT, "tp_dst")
UDP_DST = FieldSpec("udp_dst", _oxm(16), 2, KIND_INT, "tp_dst")
SCTP_DST = FieldSpec("sctp_dst", _oxm(18), 2, KIND_INT, "tp_dst")
ICMPV4_TYPE = FieldSpec("icmpv4_type", _oxm(19), 1, KIND_INT, "icmp_type")
ARP_OP = FieldSpec("arp_op", _oxm(21), 2, KIND_INT, "arp_op", "NXM_OF_ARP_OP", 0x00001E02)
ARP_SPA = FieldSpec("arp_spa", _oxm(22), 4, KIND_IP, "arp_spa", "NXM_OF_ARP_SPA", 0x00002004)
ARP_TPA = FieldSpec("arp_tpa", _oxm(23), 4, KIND_IP, "arp_tpa", "NXM_OF_ARP_TPA", 0x00002204)
ARP_SHA = FieldSpec("arp_sha", _oxm(24), 6, KIND_MAC, "arp_sha", "NXM_NX_ARP_SHA", 0x00012206)
ARP_THA = FieldSpec("arp_tha", _oxm(25), 6, KIND_MAC, "arp_tha", "NXM_NX_ARP_THA", 0x00012406)
IPV6_SRC = FieldSpec("ipv6_src", _oxm(26), 16, KIND_IP, "ipv6_src", "NXM_NX_IPV6_SRC", _nxm(0x0001, 19) | 16)
IPV6_DST = FieldSpec("ipv6_dst", _oxm(27), 16, KIND_IP, "ipv6_dst", "NXM_NX_IPV6_DST", _nxm(0x0001, 20) | 16)
ICMPV6_TYPE = FieldSpec("icmpv6_type", _oxm(29), 1, KIND_INT, "icmp_type")
ICMPV6_CODE = FieldSpec("icmpv6_code", _oxm(30), 1, KIND_INT, "icmp_code")
ND_TARGET = FieldSpec("nd_target", _oxm(31), 16, KIND_IP)
ND_TLL = FieldSpec("nd_tll", _oxm(33), 6, KIND_MAC)
# Connection tracking (Nicira extensions, class 0x0001): the state a ct() lookup left, and the
# connection's 32-bit mark (set inside ct(commit, exec(...))).
CT_STATE = FieldSpec("ct_state", _nxm(0x0001, 105), 4, KIND_CT_STATE)
CT_MARK = FieldSpec("ct_mark", _nxm(0x0001, 107), 4, KIND_HEX, "ct_mark", "NXM_NX_CT_MARK", _nxm(0x0001, 107) | 4)
# The conjunction a packet matched (NXM_NX_CONJ_ID, field 37: meta-flow.h; 84 is tun_metadata44):
# match only, what the conjunction() flows of a conjunctive match lead to.
CONJ_ID = FieldSpec("conj_id", _nxm(0x0001, 37), 4, KIND_INT)
# Scratch registers (NXM_NX_REG0..3), 32 bits each: matched (reg0=0x1/0x1) and written by load:.
REG0 = FieldSpec("reg0", _nxm(0x0001, 0), 4, KIND_HEX, "reg0", "NXM_NX_REG0", _nxm(0x0001, 0) | 4)
REG1 = FieldSpec("reg1", _nxm(0x0001, 1), 4, KIND_HEX, "reg1", "NXM_NX_REG1", _nxm(0x0001, 1) | 4)
REG2 = FieldSpec("reg2", _nxm(0x0001, 2), 4, KIND_HEX, "reg2", "NXM_NX_REG2", _nxm(0x0001, 2) | 4)
REG3 = FieldSpec("reg3", _nxm(0x0001, 3), 4, KIND_HEX, "reg3", "NXM_NX_REG3", _nxm(0x0001, 3) | 4)
# Set only (actions): NXM_NX_IP_TTL, the ERICOXM_OF ND fields (class 0x1000), the tunnel metadata.
NW_TTL = FieldSpec("nw_ttl", _nxm(0x0001, 29), 1, KIND_INT)
ND_RESERVED = FieldSpec("nd_reserved", _nxm(0x1000, 1), 4, KIND_HEX)
ND_OPTIONS_TYPE = FieldSpec("nd_options_type", _nxm(0x1000, 2), 1, KIND_INT)
TUN_DST = FieldSpec("tun_dst", _nxm(0x0001, 32), 4, KIND_IP)
TUN_IPV6_DST = FieldSpec("tun_ipv6_dst", _nxm(0x0001, 110), 16, KIND_IP)

MASKABLE = frozenset({IPV4_SRC, IPV4_DST, IPV6_SRC, IPV6_DST})  # by prefix
# By an arbitrary bit mask (a port range as tp_dst=0x1000/0xf000, a register bit as reg0=0x1/0x1).
BIT_MASKABLE = frozenset({CT_STATE, CT_MARK, TCP_DST, UDP_DST, SCTP_DST, REG0, REG1, REG2, REG3})

# ct_state bits (ovs-fields(7)), named as ovs-ofctl writes them.
CT_NEW, CT_EST, CT_REL, CT_RPL, CT_INV, CT_TRK = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
CT_FLAG_NAMES = ((CT_NEW, "new"), (CT_EST, "est"), (CT_REL, "rel"), (CT_RPL, "rpl"), (CT_INV, "inv"),
                 (CT_TRK, "trk"))


OFPVID_PRESENT = 0x1000
VLAN_MIN, VLAN_MAX = 1, 4094  # 0 means "priority tag only", 4095 is reserved (IEEE 802.1Q)


def vlan_value(vid: int) -> int:
    """``vlan_vid``'s value for VLAN ``vid`` (OFPVID_PRESENT set); ValueError outside 1..4094."""
    if isinstance(vid, bool) or not isinstance(vid, int) or not VLAN_MIN <= vid <= VLAN_MAX:
        raise ValueError(f"not a VLAN ID (1..4094): {vid!r}")
    return OFPVID_PRESENT | vid


def vlan(vid: int) -> Field:
    """Match frames tagged with VLAN ``vid``."""
    return Field(VLAN_VID, vlan_value(vid))


def mac(value: str) -> str:
    """A validated, lower-case MAC (raises ValueError)."""
    v = value.lower() if isinstance(value, str) else ""
    if len(v) != 17 or v[2::3] != ":::::" or not _HEX.issuperset(v[0::3] + v[1::3]):
        raise ValueError(f"not a MAC address: {value!r}")
    return v


def mac_value(value: str) -> int:
    return int(mac(value).replace(":", ""), 16)


class Rendered:
    """``text()`` memoized on a frozen value (planners share values between flows, and route-sync
    renders thousands): subclasses say how in ``render()``."""

    def render(self) -> str:
        raise NotImplementedError

    def text(self) -> str:
        t: str | None = self.__dict__.get("_text")
        if t is None:
            t = self.render()
            object.__setattr__(self, "_text", t)
        return t


@record(frozen=True)
class Field(Rendered):
    """``spec`` = ``value``; for an address field, ``prefix`` bits of it (``nw_dst=10.0.0.0/24``).
    A full-length prefix is written ``/32`` (``/128``) and matched exactly; /0 matches anything."""

    spec: FieldSpec
    value: int
    prefix: int | None = None
    mask: int | None = None  # bits that must equal ``value`` (BIT_MASKABLE fields); None: all

    def render(self) -> str:
        if self.spec.kind == KIND_CT_STATE:
            care = self.mask if self.mask is not None else 0xFFFFFFFF
            flags = "".join(("+" if self.value & bit else "-") + name for bit, name in CT_FLAG_NAMES if care & bit)
            return f"{self.spec.match_name}={flags}"
        if self.mask is not None:  # in hex whatever the field's kind, as ovs-ofctl prints masks
            return f"{self.spec.match_name}=0x{self.value:x}/0x{self.mask:x}"
        t = f"{self.spec.match_name}={self.spec.format(self.value)}"
        return t if self.prefix is None else f"{t}/{self.prefix}"


@record(frozen=True)
class Proto:
    """An ovs-ofctl protocol shorthand (``ip``, ``icmp6``, ...): the prerequisite fields it sets."""

    name: str
    fields: tuple[Field, ...]

    def text(self) -> str:
        return self.name


IP = Proto("ip", (Field(ETH_TYPE, 0x0800),))
IPV6 = Proto("ipv6", (Field(ETH_TYPE, 0x86DD),))
ARP = Proto("arp", (Field(ETH_TYPE, 0x0806),))
ICMP6 = Proto("icmp6", (Field(ETH_TYPE, 0x86DD), Field(IP_PROTO, 58)))
ICMP = Proto("icmp", (Field(ETH_TYPE, 0x0800), Field(IP_PROTO, 1)))
TCP = Proto("tcp", (Field(ETH_TYPE, 0x0800), Field(IP_PROTO, 6)))
UDP = Proto("udp", (Field(ETH_TYPE, 0x0800), Field(IP_PROTO, 17)))
SCTP = Proto("sctp", (Field(ETH_TYPE, 0x0800), Field(IP_PROTO, 132)))
TCP6 = Proto("tcp6", (Field(ETH_TYPE, 0x86DD), Field(IP_PROTO, 6)))
UDP6 = Proto("udp6", (Field(ETH_TYPE, 0x86DD), Field(IP_PROTO, 17)))
SCTP6 = Proto("sctp6", (Field(ETH_TYPE, 0x86DD), Field(IP_PROTO, 132)))

from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    MatchItem = Field | Proto


def address(spec: FieldSpec, text: str) -> Field:
    """An address field from ``10.0.0.1`` (exact) or ``10.0.0.0/24`` (a prefix; host bits cleared,
    as ovs-ofctl does).  ValueError for text of the wrong family or a bad prefix."""
    ip, slash, plen_text = text.partition("/")
    value, bits = addr.parse_ip(ip)
    if bits != spec.length * 8:
        raise ValueError(f"{spec.name}={text}: wrong address family")
    if not slash:
        return Field(spec, value)
    if spec not in MASKABLE:
        raise ValueError(f"{spec.name}={text}: a prefix is not matched here")
    if not plen_text.isdigit() or int(plen_text) > bits:
        raise ValueError(f"{spec.name}={text}: bad prefix length")
    plen = int(plen_text)
    return Field(spec, addr.network(value, plen, bits), plen)


def ct_state(on: int, off: int = 0) -> Field:
    """``ct_state``: the flags in ``on`` set, those in ``off`` clear, the rest ignored."""
    if on & off or (on | off) & ~0xFF:
        raise ValueError(f"ct_state: bad flags {on:#x}/{off:#x}")
    return Field(CT_STATE, on, None, on | off)


def masked(spec: FieldSpec, value: int, mask: int) -> Field:
    """``spec=value/mask`` for a field matched by bit mask (:data:`BIT_MASKABLE`)."""
    if spec not in BIT_MASKABLE:
        raise ValueError(f"{spec.name} is not matched by a bit mask here")
    if value & ~mask or not 0 <= mask < 1 << (8 * spec.length):
        raise ValueError(f"{spec.name}={value:#x}/{mask:#x}: value outside the mask, or too wide")
    return Field(spec, value, None, mask)


def match_text(items: tuple[MatchItem, ...]) -> str:
    return ",".join(i.text() for i in items)
