"""A table body for nft as data: its named sets (with their elements) and the rest of its text
(chains), so that a body whose sets alone changed is applied as set elements added and deleted
instead of the table written again.  Pure.

The host's NetworkPolicy judge (``routesync.policy.hostjudge``) renders one; its sets hold every
peer address of every rule, megabytes at 30,000 Pods, while a Pod event moves one address in a few
of them.  ``routesync.apply.nft.NftApplier.sync_policy`` writes :attr:`NftBody.text` whole when
the table is not known to hold an earlier body of the same :attr:`NftBody.shape`, and the
:func:`kept_set_changes` between the two when it is (with :func:`structure_commands` after them
when rules or sets came or went).  Each set keeps its text and digest once
made (a set the renderer reuses costs neither again), so the body's fingerprint costs one digest
per set, not the whole text."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property


@dataclass(frozen=True)
class NftSet:
    """``set <name> { type <kind>; [flags interval;] elements = { ... } }``."""

    name: str
    kind: str  # "ipv4_addr", "ipv4_addr . ipv4_addr", ...
    interval: bool
    elements: tuple[str, ...]

    @cached_property
    def text(self) -> str:
        flags = " flags interval;" if self.interval else ""
        elems = f" elements = {{ {', '.join(self.elements)} }}" if self.elements else ""
        return f"\tset {self.name} {{ type {self.kind};{flags}{elems} }}\n"

    @cached_property
    def digest(self) -> bytes:
        return hashlib.sha256(self.text.encode()).digest()

    @property
    def declaration(self) -> tuple[str, str, bool]:
        return self.name, self.kind, self.interval


@dataclass(frozen=True)
class NftChain:
    """``chain <name> { [<head>] <rules> }``: ``head`` the base chain's hook
    (``type filter hook input priority filter; policy accept;``), "" for a regular chain."""

    name: str
    head: str
    rules: tuple[str, ...]

    @cached_property
    def text(self) -> str:
        head = f"\t\t{self.head}\n" if self.head else ""
        return f"\tchain {self.name} {{\n{head}" + "".join(f"\t\t{r}\n" for r in self.rules) + "\t}\n"


@dataclass(frozen=True)
class NftBody:
    """A table's body: ``sets`` first, in order, then ``chains`` (that refer to them)."""

    sets: tuple[NftSet, ...]
    chains: tuple[NftChain, ...]
    by_name: dict[str, NftSet] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {s.name: s for s in self.sets})
        if len(self.by_name) != len(self.sets):
            raise ValueError("a set name twice in one body")

    @cached_property
    def rest(self) -> str:
        """The chains' text."""
        return "".join(c.text for c in self.chains)

    @cached_property
    def text(self) -> str:
        return "".join(s.text for s in self.sets) + self.rest

    @cached_property
    def shape(self) -> tuple[tuple[tuple[str, str, bool], ...], str]:
        """What a body must share with another for :func:`element_commands` to turn one into
        the other: the sets declared (name, type, flags) in order, and the chains."""
        return tuple(s.declaration for s in self.sets), self.rest

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits that follow the whole text (one digest per set, each kept by its set)."""
        h = hashlib.sha256(self.rest.encode())
        for s in self.sets:
            h.update(s.digest)
        return h.hexdigest()[:16]


@dataclass(frozen=True)
class SetChange:
    """Elements (as nft writes them: ``10.0.0.1``, ``10.1.0.0/16``, ``10.0.0.1 . 10.0.0.1``) to
    take out of and put into one set of type ``kind``."""

    name: str
    kind: str
    interval: bool
    gone: tuple[str, ...]
    fresh: tuple[str, ...]


def kept_set_changes(old: NftBody, new: NftBody) -> list[SetChange]:
    """What turns the elements of the sets both bodies declare alike (whatever else differs)
    into ``new``'s, set by set, in ``new``'s order.  A set that is the very object of ``old``'s
    (the renderer's memo kept it) is not compared; [] when none differs."""
    out: list[SetChange] = []
    for s in new.sets:
        was = old.by_name.get(s.name)
        if was is None or was is s or was.declaration != s.declaration or was.elements == s.elements:
            continue
        before, after = set(was.elements), set(s.elements)
        out.append(SetChange(s.name, s.kind, s.interval, tuple(e for e in was.elements if e not in after),
                             tuple(e for e in s.elements if e not in before)))
    return out


def structure_commands(family: str, table: str, old: NftBody, new: NftBody) -> str | None:
    """Commands for one transaction that turn the table from ``old`` into ``new`` where the sets
    both declare alike already hold ``new``'s elements (:func:`kept_set_changes`, applied
    first): every chain whose rules moved flushed, the sets that went deleted, the sets that came
    added with their elements, the moved chains' rules added.  None when the chains themselves
    (names, hooks, order) or a kept set's declaration differ: the table is written whole."""
    if [(c.name, c.head) for c in old.chains] != [(c.name, c.head) for c in new.chains]:
        return None
    if any(s.name in old.by_name and old.by_name[s.name].declaration != s.declaration for s in new.sets):
        return None
    moved = [c for c, was in zip(new.chains, old.chains, strict=True) if c.rules != was.rules]
    out = [f"flush chain {family} {table} {c.name}\n" for c in moved]
    out += [f"delete set {family} {table} {s.name}\n" for s in old.sets if s.name not in new.by_name]
    out += [f"add set {family} {table} {s.name} {{{s.text.split('{', 1)[1].rstrip()}\n"
            for s in new.sets if s.name not in old.by_name]
    out += [f"add rule {family} {table} {c.name} {r}\n" for c in moved for r in c.rules]
    return "".join(out)


def element_commands(family: str, table: str, changes: list[SetChange]) -> str:
    """The ``delete element`` and then ``add element`` commands of ``changes``, for one
    transaction: every removal comes before every addition, so an interval that replaces an
    overlapping one (a block and an address inside it, collapsed one way and then the other) is
    never refused."""
    removes = [f"delete element {family} {table} {c.name} {{ {', '.join(c.gone)} }}\n" for c in changes if c.gone]
    adds = [f"add element {family} {table} {c.name} {{ {', '.join(c.fresh)} }}\n" for c in changes if c.fresh]
    return "".join(removes) + "".join(adds)
