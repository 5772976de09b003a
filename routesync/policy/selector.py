"""Kubernetes label selectors (``metav1.LabelSelector``) as plain data, and matching.

``matchLabels`` and ``matchExpressions`` (``In``, ``NotIn``, ``Exists``, ``DoesNotExist``) are
ANDed; an empty selector matches everything.  What the API server would refuse raises
:class:`SelectorError` naming the field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A selector Ferry cannot read; the message names the field."""


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn


@dataclass(frozen=True)
class Selector:
    """All of ``requirements`` (``matchLabels`` become ``In`` with one value)."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def everything(self) -> bool:
        return not self.requirements


EVERYTHING = Selector()


def parse(doc: Any, where: str) -> Selector:
    """A ``LabelSelector`` JSON object (``None``: everything)."""
    if doc is None:
        return EVERYTHING
    if not isinstance(doc, dict):
        raise SelectorError(f"{where}: not an object")
    reqs: list[Requirement] = []
    labels = doc.get("matchLabels") or {}
    if not isinstance(labels, dict):
        raise SelectorError(f"{where}.matchLabels: not an object")
    for k, v in sorted(labels.items()):
        if not isinstance(k, str) or not isinstance(v, str):
            raise SelectorError(f"{where}.matchLabels[{k!r}]: not a string")
        reqs.append(Requirement(k, "In", frozenset((v,))))
    exprs = doc.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise SelectorError(f"{where}.matchExpressions: not a list")
    for i, e in enumerate(exprs):
        w = f"{where}.matchExpressions[{i}]"
        if not isinstance(e, dict):
            raise SelectorError(f"{w}: not an object")
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if not isinstance(key, str) or not key:
            raise SelectorError(f"{w}.key: missing")
        if op not in OPERATORS:
            raise SelectorError(f"{w}.operator: {op!r} is not one of {', '.join(OPERATORS)}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise SelectorError(f"{w}.values: not a list of strings")
        if op in ("In", "NotIn") and not values:
            raise SelectorError(f"{w}.values: {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise SelectorError(f"{w}.values: {op} takes none")
        reqs.append(Requirement(key, op, frozenset(values)))
    return Selector(tuple(reqs))
