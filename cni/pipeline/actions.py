"""Actions as typed values: what a flow does with a packet it matched.  A flow's actions are a
tuple of these, applied in order; an empty tuple drops the packet; :class:`Goto` may only come
last.  ``text()`` renders ovs-ofctl syntax (logs, dumps, tests); :mod:`cni.ovs.openflow.codec`
encodes the values themselves.  Standard library only, imported on every ADD/DEL."""

from __future__ import annotations

from cni.lean.record import record
from cni.pipeline.match import ETH_DST, ETH_SRC, KIND_IP, KIND_MAC, VLAN_VID, FieldSpec, Rendered, vlan_value

OFPP_IN_PORT = 0xFFFFFFF8  # "the port the packet came in on"


@record(frozen=True)
class Output:
    port: int

    def text(self) -> str:
        return "IN_PORT" if self.port == OFPP_IN_PORT else f"output:{self.port}"


@record(frozen=True)
class Goto:
    """``goto_table``: continue in a later table (an instruction; last, after the actions)."""

    table: int

    def text(self) -> str:
        return f"goto_table:{int(self.table)}"


@record(frozen=True)
class SetField(Rendered):
    """Write ``value`` into a field (OFPAT_SET_FIELD); Ethernet addresses render as ovs-ofctl's
    ``mod_dl_src``/``mod_dl_dst``, the names its dumps use."""

    spec: FieldSpec
    value: int

    def render(self) -> str:
        value = self.spec.format(self.value)
        if self.spec is ETH_SRC:
            return f"mod_dl_src:{value}"
        if self.spec is ETH_DST:
            return f"mod_dl_dst:{value}"
        return f"set_field:{value}->{self.spec.name}"


@record(frozen=True)
class Move:
    """Copy a whole field into another of the same width (NXAST_REG_MOVE)."""

    src: FieldSpec
    dst: FieldSpec

    def __post_init__(self) -> None:
        if self.src.length != self.dst.length or not (self.src.nxm and self.dst.nxm):
            raise ValueError(f"move {self.src.name} -> {self.dst.name}: fields of different widths, "
                             "or without NXM names")

    def text(self) -> str:
        return f"move:{self.src.nxm}[]->{self.dst.nxm}[]"


@record(frozen=True)
class Load(Rendered):
    """Write a constant into a field (NXAST_REG_LOAD, as ovs-ofctl sends ``load:``): the whole field,
    or with ``width`` its bits ``offset`` .. ``offset + width - 1`` (``load:0x1->NXM_NX_REG0[0]``),
    the others left as they are."""

    value: int
    dst: FieldSpec
    offset: int = 0
    width: int | None = None  # None: the whole field (from bit 0)

    def __post_init__(self) -> None:
        if not self.dst.nxm:
            raise ValueError(f"load {self.value:#x} -> {self.dst.name}: no NXM name")
        if self.width is None:
            if self.offset or not 0 <= self.value < 1 << min(64, 8 * self.dst.length):
                raise ValueError(f"load {self.value:#x} -> {self.dst.name}: does not fit, or an offset without a width")
        elif not (0 <= self.offset and 1 <= self.width <= 64 and self.offset + self.width <= 8 * self.dst.length
                  and 0 <= self.value < 1 << self.width):
            raise ValueError(f"load {self.value:#x} -> {self.dst.name}[{self.offset}, {self.width} bits]: "
                             "bits outside the field, or a value wider than them")

    def bits(self) -> tuple[int, int]:
        """(offset, width) of the bits written."""
        return (self.offset, 8 * self.dst.length if self.width is None else self.width)

    def render(self) -> str:
        offset, width = self.bits()
        if self.width is None and self.dst.kind in (KIND_MAC, KIND_IP):  # an address, every digit
            return f"load:0x{self.value:0{2 * self.dst.length}x}->{self.dst.nxm}[]"
        if offset == 0 and width == 8 * self.dst.length:
            return f"load:{self.value:#x}->{self.dst.nxm}[]"
        bits = f"{offset}" if width == 1 else f"{offset}..{offset + width - 1}"
        return f"load:{self.value:#x}->{self.dst.nxm}[{bits}]"


@record(frozen=True)
class DecTtl:
    def text(self) -> str:
        return "dec_ttl"


@record(frozen=True)
class PushVlan:
    """Push an 802.1Q header (OFPAT_PUSH_VLAN, TPID ``ethertype``); its VID is set after it."""

    ethertype: int = 0x8100

    def text(self) -> str:
        return f"push_vlan:{self.ethertype:#x}"


@record(frozen=True)
class PopVlan:
    """Pop the outermost 802.1Q header (OFPAT_POP_VLAN)."""

    def text(self) -> str:
        return "pop_vlan"


@record(frozen=True)
class Resubmit:
    """Run the packet, as modified so far, through ``table`` again (``resubmit(,T)``), then go on."""

    table: int

    def text(self) -> str:
        return f"resubmit(,{int(self.table)})"


@record(frozen=True)
class Ct:
    """Send the packet through connection tracking in ``zone`` (NXAST_CT).  ``commit`` stores the
    connection, and then ``exec`` (``SetField`` of ``ct_mark`` only) writes into the stored entry.
    ``table``: recirculate a copy, its ``ct_state`` filled in, to that table (None: the packet
    goes on in this action list, untracked)."""

    zone: int
    commit: bool = False
    table: int | None = None
    exec: tuple[SetField, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.zone <= 0xFFFF or (self.table is not None and not 0 <= self.table < 0xFF):
            raise ValueError(f"ct: zone {self.zone} or table {self.table} out of range")
        if self.exec and not self.commit:
            raise ValueError("ct: exec() writes the stored connection, so it needs commit")
        if any(a.spec.name != "ct_mark" for a in self.exec):
            raise ValueError("ct: exec() sets ct_mark only here")

    def text(self) -> str:
        parts = ["commit"] if self.commit else []
        parts.append(f"zone={self.zone}")
        if self.table is not None:
            parts.append(f"table={int(self.table)}")
        if self.exec:
            parts.append(f"exec({','.join(a.text() for a in self.exec)})")
        return f"ct({','.join(parts)})"


@record(frozen=True)
class Conjunction:
    """Clause ``clause`` (1-based, as ovs-ofctl writes it) of ``n_clauses`` of conjunctive match
    ``id`` (NXAST_CONJUNCTION): a packet this flow matches satisfies that clause; one that satisfies
    every clause of ``id`` is then matched by the flow on ``conj_id=id``.  A flow carrying it
    carries only Conjunction actions (a clause shared by several conjunctions: one each)."""

    id: int
    clause: int
    n_clauses: int

    def __post_init__(self) -> None:
        if not (0 <= self.id <= 0xFFFFFFFF and 2 <= self.n_clauses <= 64 and 1 <= self.clause <= self.n_clauses):
            raise ValueError(f"conjunction({self.id},{self.clause}/{self.n_clauses}): id is 32 bits, "
                             "2 to 64 clauses, the clause 1-based")

    def text(self) -> str:
        return f"conjunction({self.id},{self.clause}/{self.n_clauses})"


@record(frozen=True)
class Controller:
    """Send the packet to the controllers (NXAST_CONTROLLER2: a packet-in, reason ``action``) with
    ``userdata`` (at most 1,024 bytes), at most ``max_len`` bytes of it, through OpenFlow meter
    ``meter_id`` first (None: unmetered), so a flood of them is dropped in the datapath instead
    of reaching ovs-vswitchd and the controller.  The packet itself goes on with the next action."""

    userdata: bytes
    max_len: int = 0xFFFF
    meter_id: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.userdata, bytes) and len(self.userdata) <= 1024 and 0 <= self.max_len <= 0xFFFF
                and (self.meter_id is None or 1 <= self.meter_id <= 0xFFFF0000)):
            raise ValueError(f"controller: userdata is bytes (<= 1024), max_len 16 bits, meter_id 1..0xffff0000 "
                             f"(got {len(self.userdata)} bytes, {self.max_len}, {self.meter_id})")

    def text(self) -> str:
        parts = [] if self.max_len == 0xFFFF else [f"max_len={self.max_len}"]
        if self.userdata:
            parts.append("userdata=" + ".".join(f"{b:02x}" for b in self.userdata))
        if self.meter_id is not None:
            parts.append(f"meter_id={self.meter_id}")
        return f"controller({','.join(parts)})"


from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    Action = (Output | Goto | SetField | Move | Load | DecTtl | Resubmit | Ct | Conjunction | PushVlan | PopVlan
              | Controller)

TO_IN_PORT = Output(OFPP_IN_PORT)  # back out of the port the packet came in on
DEC_TTL = DecTtl()
DROP: tuple[Action, ...] = ()


def goto(table: int) -> Goto:
    return Goto(int(table))


def output(port: int) -> Output:
    return Output(int(port))


POP_VLAN = PopVlan()


def tagged_output(port: int, vid: int | None) -> tuple[Action, ...]:
    """Output to ``port``, tagged with VLAN ``vid`` first when there is one (the transport VLAN:
    everything Ferry sends on the uplink of a tagged underlay)."""
    if vid is None:
        return (Output(int(port)),)
    return (PushVlan(), SetField(VLAN_VID, vlan_value(vid)), Output(int(port)))


def actions_text(actions: tuple[Action, ...]) -> str:
    return ",".join(a.text() for a in actions) or "drop"
