"""routesync.nftbody: a body's text, fingerprint and shape; the element changes between two bodies
(held on random sets to what they must turn one into: the other's), and the structure commands
when rules or sets came or went."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routesync.nftbody import (
    NftBody,
    NftChain,
    NftSet,
    SetChange,
    element_commands,
    kept_set_changes,
    structure_commands,
)

EGRESS = NftChain("egress", "", ("ip saddr @a4 ip daddr @p4 accept",))
CHAINS = (EGRESS,)
TEXT = "\tchain egress {\n\t\tip saddr @a4 ip daddr @p4 accept\n\t}\n"


def body(a: tuple[str, ...], p: tuple[str, ...], chains: tuple[NftChain, ...] = CHAINS) -> NftBody:
    return NftBody((NftSet("a4", "ipv4_addr", False, a), NftSet("p4", "ipv4_addr", True, p)), chains)


def test_the_text_is_the_sets_then_the_rest() -> None:
    b = body(("10.0.0.1",), ())
    assert b.text == ("\tset a4 { type ipv4_addr; elements = { 10.0.0.1 } }\n"
                      "\tset p4 { type ipv4_addr; flags interval; }\n" + TEXT)
    hooked = NftChain("input", "type filter hook input priority filter; policy accept;", ("jump egress",))
    assert hooked.text == ("\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n"
                           "\t\tjump egress\n\t}\n")


def test_the_fingerprint_follows_the_text() -> None:
    one, same, other = body(("10.0.0.1",), ()), body(("10.0.0.1",), ()), body(("10.0.0.2",), ())
    assert one.fingerprint == same.fingerprint != other.fingerprint
    assert body(("10.0.0.1",), (), (NftChain("egress", "", ("accept",)),)).fingerprint != one.fingerprint
    assert one.shape == other.shape and body((), (), ()).shape != one.shape


def test_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        NftBody((NftSet("a4", "ipv4_addr", False, ()), NftSet("a4", "ipv4_addr", False, ())), ())


def test_rules_and_sets_that_come_and_go_are_one_transaction_after_the_kept_sets_elements() -> None:
    old = body(("10.0.0.1",), ("10.1.0.0/24",))
    r9 = NftSet("r9p4", "ipv4_addr", True, ("10.2.0.0/16",))
    new = NftBody((NftSet("a4", "ipv4_addr", False, ("10.0.0.2",)), r9),
                  (NftChain("egress", "", ("ip saddr @a4 ip daddr @r9p4 accept", "counter drop")),))
    assert [(c.name, c.gone, c.fresh) for c in kept_set_changes(old, new)] == [("a4", ("10.0.0.1",), ("10.0.0.2",))]
    assert structure_commands("inet", "t", old, new) == (
        "flush chain inet t egress\n"
        "delete set inet t p4\n"
        "add set inet t r9p4 { type ipv4_addr; flags interval; elements = { 10.2.0.0/16 } }\n"
        "add rule inet t egress ip saddr @a4 ip daddr @r9p4 accept\n"
        "add rule inet t egress counter drop\n")
    # chains that came, went or moved, or a set declared otherwise under its name: written whole
    assert structure_commands("inet", "t", old, body((), (), (EGRESS, NftChain("ingress", "", ())))) is None
    hooked = (NftChain("egress", "type filter hook input priority filter; policy accept;", EGRESS.rules),)
    assert structure_commands("inet", "t", old, body((), (), hooked)) is None
    redeclared = NftBody((NftSet("a4", "ipv4_addr", True, ()), NftSet("p4", "ipv4_addr", True, ())), CHAINS)
    assert structure_commands("inet", "t", old, redeclared) is None
    assert kept_set_changes(old, redeclared) == [SetChange("p4", "ipv4_addr", True, ("10.1.0.0/24",), ())]


def test_the_same_set_object_is_not_compared_and_removals_come_first() -> None:
    kept = NftSet("a4", "ipv4_addr", False, ("10.0.0.1",))
    old = NftBody((kept, NftSet("p4", "ipv4_addr", True, ("10.1.0.0/24",))), CHAINS)
    new = NftBody((kept, NftSet("p4", "ipv4_addr", True, ("10.1.0.0/25",))), CHAINS)
    changes = kept_set_changes(old, new)
    assert [c.name for c in changes] == ["p4"]
    assert element_commands("inet", "t", changes) == ("delete element inet t p4 { 10.1.0.0/24 }\n"
                                                      "add element inet t p4 { 10.1.0.0/25 }\n")
    assert kept_set_changes(old, old) == []


def _applied(old: NftBody, commands: str) -> dict[str, set[str]]:
    """What nft holds after ``commands`` on a table that held ``old`` (each command's elements
    deleted from or added to its set, in order, as one transaction does)."""
    sets = {s.name: set(s.elements) for s in old.sets}
    for line in commands.splitlines():
        m = re.fullmatch(r"(add|delete) element inet t (\w+) \{ (.*) \}", line)
        assert m, line
        elements = set(m.group(3).split(", "))
        if m.group(1) == "delete":
            assert elements <= sets[m.group(2)]  # nft refuses to delete what a set lacks
            sets[m.group(2)] -= elements
        else:
            assert not elements & sets[m.group(2)]  # nor to add what it holds
            sets[m.group(2)] |= elements
    return sets


ADDRESSES = st.lists(st.sampled_from([f"10.0.0.{i}" for i in range(12)]), unique=True, max_size=8).map(tuple)


@settings(max_examples=300, deadline=None)
@given(ADDRESSES, ADDRESSES, ADDRESSES, ADDRESSES)
def test_element_commands_turn_one_body_into_the_other(a0: tuple[str, ...], p0: tuple[str, ...],
                                                       a1: tuple[str, ...], p1: tuple[str, ...]) -> None:
    old, new = body(a0, p0), body(a1, p1)
    commands = element_commands("inet", "t", kept_set_changes(old, new))
    want = {s.name: set(s.elements) for s in new.sets}
    assert _applied(old, commands) == want
    assert (commands == "") == ({s.name: set(s.elements) for s in old.sets} == want)
