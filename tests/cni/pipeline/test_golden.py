"""The pipeline's flows as text, against a file a reviewer reads: ``golden/pipeline.txt`` holds
``Flow.text()`` of the base flows, one dual-stack Pod (and its pending policy drops), a chained
Pod's next hops, the uplink's pass-through, a tunnel peer (encap, VXLAN), a fast-path peer
(noEncap) and one NetworkPolicy, each section under a ``## name`` line.

A change to a planner changes this file: regenerate it and the diff is what the change does to
the switch, flow by flow::

    FERRY_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/cni/pipeline/test_golden.py

No root, no switch: ``tests/cni/ovs/test_openflow_install.py`` and the root tests show the
switch takes these flows and what they do."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from cni.pipeline import tables as pl
from cni.pipeline.chained import next_hop_flows
from cni.pipeline.flows import GatewayPort, PodPort, base_flows, pending_flows, pod_flows
from cni.pipeline.tables import Flow
from routesync.apply.uplink import uplink_flows
from routesync.config import from_dict
from routesync.model import LocalFacts, NextHop, NodeRecord
from routesync.planner import plan
from routesync.policy import plan as pp
from routesync.policy.model import Pod, policy_from
from tests.support.paths import REPO

GOLDEN = Path(__file__).parent / "golden" / "pipeline.txt"
UPDATE = "FERRY_UPDATE_GOLDEN"

GW = GatewayPort(ofport=2, mac="02:00:00:00:01:01", addresses=("10.244.1.1/24", "fd00:10:244:1::1/64"))
POD = PodPort(cookie=pl.pod_cookie("c1", "eth0"), ofport=1031, mac="02:11:22:33:44:55",
              addresses=("10.244.1.5/24", "fd00:10:244:1::5/64"))
LOCAL = NodeRecord("n1", ("192.168.77.11", "fd00:77::11"), ("10.244.1.0/24", "fd00:10:244:1::/64"))
PEER = NodeRecord("n2", ("192.168.77.12", "fd00:77::12"), ("10.244.2.0/24", "fd00:10:244:2::/64"),
                  (("ferry.io/mac-address", "02:00:00:00:77:12"),))


def facts(tunnel_ofport: int | None, moved: bool) -> LocalFacts:
    return LocalFacts(GW.ofport, GW.mac, tunnel_ofport, "eth0", ("192.168.77.11/24", "fd00:77::11/64"), 1500,
                      uplink_mac="02:00:00:00:77:11" if moved else None, uplink_ofport=5 if moved else None,
                      uplink_host_ofport=6 if moved else None)


def mode_flows(config: dict[str, object], tunnel_ofport: int | None, moved: bool) -> list[Flow]:
    """What route-sync installs for one peer in one mode, beyond the base flows."""
    hops = {"192.168.77.12": NextHop("192.168.77.12", "02:00:00:00:77:12"),
            "fd00:77::12": NextHop("fd00:77::12", "02:00:00:00:77:12")}
    d = plan(from_dict({"nodeName": "n1", **config}), LOCAL, [PEER], facts(tunnel_ofport, moved), hops)
    base = set(base_flows(GW))
    return [f for f in d.flows if f not in base]


def policy_flows() -> list[Flow]:
    """One policy: the Pods labelled app=web take TCP 80 from app=client in any namespace and
    send only to UDP 53 of app=client."""
    pods = (Pod("web", "srv", "n1", (("app", "web"),), ("10.244.1.5", "fd00:10:244:1::5"), ()),
            Pod("c", "cli", "n2", (("app", "client"),), ("10.244.2.7",), ()))
    rule = {"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}],
            "ports": [{"port": 80}]}
    out = {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "client"}}}],
           "ports": [{"protocol": "UDP", "port": 53}]}
    policy = policy_from({"metadata": {"namespace": "web", "name": "allow-client"},
                          "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress", "Egress"],
                                   "ingress": [rule], "egress": [out]}})
    inputs = pp.Inputs(pods, {"web": (), "c": ()}, (policy,))
    facts = pp.NodeFacts("n1", ("10.244.1.1", "fd00:10:244:1::1"), ("10.96.0.0/12",), denied_log=True)
    return list(pp.plan(inputs, facts).flows)


def sections() -> dict[str, list[Flow]]:
    return {
        "base flows (gateway ofport 2, 10.244.1.1/24 and fd00:10:244:1::1/64)": base_flows(GW),
        "a dual-stack Pod (ofport 1031, 10.244.1.5, fd00:10:244:1::5)": pod_flows(POD, GW.mac, GW.ofport),
        "its pending policy drops": pending_flows(POD.cookie, POD.addresses),
        "a chained Pod's next hops": next_hop_flows(POD.cookie, POD.ofport, ("10.244.1.1", "fd00:10:244:1::1"),
                                                    GW.mac),
        "the uplink's host pass-through (physical 5, internal 6)": uplink_flows(5, 6),
        "a tunnel peer: encap, VXLAN (tunnel ofport 3)":
            mode_flows({"trafficEncapMode": "encap", "tunnelType": "vxlan"}, 3, moved=False),
        "a fast-path peer: noEncap, on the segment (uplink 5, host port 6)":
            mode_flows({"trafficEncapMode": "noEncap", "fastPath": True}, None, moved=True),
        "a NetworkPolicy: app=web takes TCP 80 from app=client, sends to its UDP 53": policy_flows(),
    }


def render() -> str:
    out = []
    for title, flows in sections().items():
        out.append(f"## {title}")
        out += [f.text() for f in flows]
        out.append("")
    return "\n".join(out)


def test_the_planned_flows_are_the_golden_file() -> None:
    text = render()
    if os.environ.get(UPDATE) == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    want = GOLDEN.read_text() if GOLDEN.exists() else ""
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            f"{GOLDEN.name} (file)", f"{GOLDEN.name} (planned now)"))
        raise AssertionError(f"the planned flows differ from {GOLDEN}:\n{diff}\n"
                             f"if the change is meant, regenerate and commit the file:\n"
                             f"  {UPDATE}=1 .venv/bin/python -m pytest -q {Path(__file__).relative_to(REPO)}")


def test_every_section_plans_something() -> None:
    assert all(sections().values())
