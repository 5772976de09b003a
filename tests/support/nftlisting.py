"""An nftables table as ``nft list table`` prints it, read for comparison: its sets by name (nft
lists them in the order they were created, so a set added in place comes after those a whole write
puts beside it) and its chains in order, counters' values and Ferry's fingerprint comment left
out."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Listing:
    sets: dict[str, str]
    chains: tuple[str, ...]


def read(text: str) -> Listing:
    sets: dict[str, str] = {}
    chains: list[str] = []
    block: list[str] = []
    for line in text.splitlines():
        if 'comment "ferry:' in line:
            continue
        line = re.sub(r"counter packets \d+ bytes \d+", "counter", line)
        if line.startswith("\t") and not line.startswith("\t\t") and line.strip() not in ("", "}"):
            block = [line]  # "\tset NAME {" or "\tchain NAME {"
            continue
        if block and line == "\t}":
            kind, name = block[0].split()[:2]
            if kind == "chain":
                chains.append("\n".join(block))
            else:
                sets[name] = "\n".join(block)
            block = []
            continue
        if block:
            block.append(line)
    return Listing(sets, tuple(chains))


def table(netns: str, family: str, name: str) -> Listing:
    """``nft list table`` of ``family name`` in network namespace ``netns``, read."""
    return read(subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "table", family, name],
                               capture_output=True, text=True, check=True).stdout)
