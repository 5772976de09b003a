"""routesync.nftbody: a body's text, fingerprint and shape, and the element commands between two
bodies of one shape (held on random sets to what they must turn one into: the other's)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routesync.nftbody import NftBody, NftSet, element_changes, element_commands

CHAINS = "\tchain egress {\n\t\tip saddr @a4 ip daddr @p4 accept\n\t}\n"


def body(a: tuple[str, ...], p: tuple[str, ...], rest: str = CHAINS) -> NftBody:
    return NftBody((NftSet("a4", "ipv4_addr", False, a), NftSet("p4", "ipv4_addr", True, p)), rest)


def test_the_text_is_the_sets_then_the_rest() -> None:
    b = body(("10.0.0.1",), ())
    assert b.text == ("\tset a4 { type ipv4_addr; elements = { 10.0.0.1 } }\n"
                      "\tset p4 { type ipv4_addr; flags interval; }\n" + CHAINS)


def test_the_fingerprint_follows_the_text() -> None:
    one, same, other = body(("10.0.0.1",), ()), body(("10.0.0.1",), ()), body(("10.0.0.2",), ())
    assert one.fingerprint == same.fingerprint != other.fingerprint
    assert body(("10.0.0.1",), (), CHAINS + "\n").fingerprint != one.fingerprint
    assert one.shape == other.shape and body((), (), "").shape != one.shape


def test_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        NftBody((NftSet("a4", "ipv4_addr", False, ()), NftSet("a4", "ipv4_addr", False, ())), "")


def test_bodies_of_other_shapes_have_no_element_commands() -> None:
    with pytest.raises(ValueError, match="shape"):
        element_changes(body((), ()), body((), (), ""))


def test_the_same_set_object_is_not_compared_and_removals_come_first() -> None:
    kept = NftSet("a4", "ipv4_addr", False, ("10.0.0.1",))
    old = NftBody((kept, NftSet("p4", "ipv4_addr", True, ("10.1.0.0/24",))), CHAINS)
    new = NftBody((kept, NftSet("p4", "ipv4_addr", True, ("10.1.0.0/25",))), CHAINS)
    changes = element_changes(old, new)
    assert [c.name for c in changes] == ["p4"]
    assert element_commands("inet", "t", changes) == ("delete element inet t p4 { 10.1.0.0/24 }\n"
                                                      "add element inet t p4 { 10.1.0.0/25 }\n")
    assert element_changes(old, old) == []


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
    commands = element_commands("inet", "t", element_changes(old, new))
    want = {s.name: set(s.elements) for s in new.sets}
    assert _applied(old, commands) == want
    assert (commands == "") == ({s.name: set(s.elements) for s in old.sets} == want)
