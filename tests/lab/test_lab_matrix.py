"""``ferry-lab demo`` in every traffic mode for IPv4-only, IPv6-only and dual-stack labs, and with
each mode flag: one lab per combination, brought up once by the real command (``demo --family F
--mode M ...``: up, 2 Pods per Node, the whole connectivity matrix), then checked from what it
left: the matrix passed with exactly 15 probes per family, every part has exactly the lab's
families, each Node's state file names the mode's path to each peer, and ``show --svg/--png``
draws one edge per pair labelled with that path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import yaml

from lab import build, layout
from lab.api import Lab
from lab.topology import families_of
from tests.support.labs import can_run

pytestmark = [pytest.mark.root, pytest.mark.slow]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SVG = "{http://www.w3.org/2000/svg}"
FAMILIES = {"4": (4,), "6": (6,), "dual": (4, 6)}
PROBES_PER_FAMILY = 15  # 3 same-node + 3 pod-to-node + 1 same-subnet + 2 other-subnet + 3 remote Node + 3 external
NEAR, FAR = ("node-1", "node-2"), ("node-1", "node-3")  # one segment / across the router


@dataclass(frozen=True)
class Case:
    family: str
    flags: tuple[str, ...]
    near: str  # the path node-1 <-> node-2 settles on
    far: str  # node-1 <-> node-3
    tunnel: str | None = None  # the state file's tunnel type

    @property
    def id(self) -> str:
        return f"{self.family}-{'-'.join(f.lstrip('-') for f in self.flags)}"


MODES = {  # mode -> (near, far, tunnel)
    "encap": ("tunnel", "tunnel", "vxlan"),
    "noEncap": ("route", "underlay", None),
    "hybrid": ("route", "tunnel", "vxlan"),
    "networkPolicyOnly": ("none", "none", None),
}
CASES = [Case(fam, ("--mode", mode), *MODES[mode]) for fam in FAMILIES for mode in MODES] + [
    Case("4", ("--mode", "encap", "--tunnel", "gre"), "tunnel", "tunnel", "gre"),
    Case("6", ("--mode", "encap", "--tunnel", "geneve"), "tunnel", "tunnel", "geneve"),
    Case("6", ("--mode", "hybrid", "--tunnel", "gre"), "route", "tunnel", "gre"),
    Case("6", ("--mode", "hybrid", "--fast-path"), "fast", "tunnel", "vxlan"),
    Case("dual", ("--mode", "noEncap", "--fast-path"), "fast", "fast"),
]
LABELS = {"tunnel": "{tunnel} tunnel", "route": "routed", "underlay": "underlay", "fast": "fast path",
          "none": "no Ferry path"}
_t0: list[float] = []


def ferry_lab(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def pair_paths(lab: Lab, a: str, b: str) -> set[str]:
    """The paths both Nodes' state files name for each other, every family."""
    out = set()
    for me, other in ((a, b), (b, a)):
        for p in (lab.node(me).state() or {}).get("peers") or []:
            if p["name"] == other:
                out.add(p["path"])
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_demo_passes_the_whole_matrix(case: Case, cni_bin: str, new_lab_name: Callable[[], str],
                                      tmp_path) -> None:  # type: ignore[no-untyped-def]
    reason = can_run()
    if reason:
        pytest.skip(reason)
    fams = FAMILIES[case.family]
    name = new_lab_name()
    t0 = time.monotonic()
    try:
        demo = ferry_lab("demo", "--name", name, "--cni-bin", cni_bin, "--family", case.family, *case.flags,
                         "--picture", str(tmp_path / "demo.svg"))
        took = time.monotonic() - t0
        total = PROBES_PER_FAMILY * len(fams)
        # the whole matrix passed, with exactly the lab's families
        assert demo.returncode == 0, demo.stdout[-4000:] + demo.stderr[-2000:]
        assert f"\n{total}/{total} probes passed" in demo.stdout, demo.stdout[-2000:]
        assert f"families probed: {' + '.join(f'IPv{f}' for f in fams)}\n" in demo.stdout
        assert "not configured" not in demo.stdout
        assert f"picture of the lab: {tmp_path / 'demo.svg'}" in demo.stdout
        print(f"{case.id}: demo {took:.1f}s, {total}/{total} probes")

        lab = Lab.attach(name)
        # every part has exactly the lab's families
        for n in lab.nodes:
            with open(os.path.join(layout.registry_dir(lab.dir), f"{n.name}.yaml")) as f:
                record = yaml.safe_load(f)
            assert families_of(record["transportAddresses"]) == fams, record
            got = json.loads(n.exec(["ip", "-j", "addr", "show", "scope", "global"], check=True).stdout)
            have = {6 if a["family"] == "inet6" else 4 for link in got for a in link.get("addr_info", []) if a}
            assert tuple(sorted(have)) == fams, (n.name, got)
            for p in n.pods():
                assert families_of(p.ips) == fams, (p.name, p.ips)
        assert tuple(sorted(6 if ":" in a else 4 for a in lab.external.addresses)) == fams

        # the mode's path between each pair, as the state files name it (the fast path once the
        # next hop's MAC is known: waited for, not assumed)
        mode = case.flags[case.flags.index("--mode") + 1]
        for n in lab.nodes:
            st = n.state() or {}
            assert st.get("mode") == mode
            assert (st.get("tunnel") or {}).get("type") == case.tunnel
        wait_for(lambda: pair_paths(lab, *NEAR) == {case.near}, f"{NEAR} path {case.near}: {pair_paths(lab, *NEAR)}")
        wait_for(lambda: pair_paths(lab, *FAR) == {case.far}, f"{FAR} path {case.far}: {pair_paths(lab, *FAR)}")

        # the picture: one edge per pair, labelled with its path
        show = ferry_lab("show", "--name", name, "--svg", str(tmp_path / "lab.svg"), "--png", str(tmp_path / "lab.png"))
        assert show.returncode == 0, show.stderr
        svg = ET.parse(tmp_path / "lab.svg").getroot()
        edges = {g.findtext(f"{SVG}title"): [t.text for t in g.iter(f"{SVG}text")]
                 for g in svg.iter(f"{SVG}g") if g.get("class") == "edge"}
        far2 = ("node-2", "node-3")
        for (a, b), path in ((NEAR, case.near), (FAR, case.far), (far2, case.far)):
            label = LABELS[path].format(tunnel=case.tunnel)
            assert edges.get(f"node_{a.replace('-', '_')}--node_{b.replace('-', '_')}") == [label], edges
        assert (tmp_path / "lab.png").read_bytes().startswith(b"\x89PNG")
    finally:
        build.down(name)
