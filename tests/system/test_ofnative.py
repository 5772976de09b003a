"""cni.ofnative installs exactly what ovs-ofctl installs for every flow the plugin plans,
deletes by cookie exactly, and reports the switch's refusals."""

from __future__ import annotations

import pytest

from cni import pipeline as pl
from cni.flows import GatewayPort, PodPort, base_flows, pod_flows
from cni.ofnative import NativeOpenFlow, OpenFlowError, encode_instructions, encode_match
from tests.ovs_instance import OvsInstance, netns

pytestmark = pytest.mark.root

GW = GatewayPort(ofport=2, mac="02:00:00:00:00:01", addresses=("10.244.1.1/24", "fd00:10:244:1::1/64"))
POD_A = PodPort(cookie=pl.pod_cookie("fs-a", "eth0"), ofport=7, mac="02:11:22:33:44:55",
                addresses=("10.244.1.5/24", "fd00:10:244:1::5/64"))
POD_B = PodPort(cookie=pl.pod_cookie("fs-b", "eth0"), ofport=8, mac="02:11:22:33:44:66",
                addresses=("10.244.1.6/24",))


@pytest.fixture
def ovs():
    with netns("fs-ofn") as ns, OvsInstance("fs-ofn", netns=ns) as o:
        for br in ("brn", "bro"):
            o.vsctl("add-br", br, "--", "set", "bridge", br, "datapath_type=netdev", "fail_mode=secure")
        yield o


def _dump(o, br: str) -> list[str]:
    out = o.ofctl("dump-flows", br, "--no-stats")
    return sorted(line.strip() for line in out.splitlines() if "actions=" in line)


def test_native_and_ofctl_install_the_same_flows(ovs):
    flows = base_flows(GW) + pod_flows(POD_A, GW.mac, GW.ofport) + pod_flows(POD_B, GW.mac, GW.ofport)
    NativeOpenFlow("brn", ovs.run_dir).add_flows(flows)
    ovs.ofctl("add-flows", "bro", "-", input="".join(f.text() + "\n" for f in flows))
    native, reference = _dump(ovs, "brn"), _dump(ovs, "bro")
    assert len(native) == len(flows)
    assert native == reference


def test_delete_by_cookie_removes_exactly_that_pod(ovs):
    nat = NativeOpenFlow("brn", ovs.run_dir)
    nat.add_flows(base_flows(GW) + pod_flows(POD_A, GW.mac) + pod_flows(POD_B, GW.mac))
    nat.del_flows(POD_A.cookie)
    left = _dump(ovs, "brn")
    assert not any(f"cookie={POD_A.cookie.value:#x}" in x for x in left)
    assert any(f"cookie={POD_B.cookie.value:#x}" in x for x in left)
    assert sum(f"cookie={pl.BASE_COOKIE.value:#x}" in x for x in left) == len(base_flows(GW))


def test_switch_refusal_is_reported(ovs):
    bad = pl.Flow(pl.Table.CLASSIFIER, 10, "in_port=1", "goto_table:0", pl.BASE_COOKIE)  # goto backwards
    with pytest.raises(OpenFlowError, match="refused"):
        NativeOpenFlow("brn", ovs.run_dir).add_flows([bad])


def test_missing_bridge_is_reported(ovs):
    with pytest.raises(OpenFlowError, match="cannot connect"):
        NativeOpenFlow("nope", ovs.run_dir).del_flows(POD_A.cookie)


@pytest.mark.parametrize("match", ["tcp", "nw_ttl=3", "in_port=LOCAL", "dl_src=02:00:00:00:00:01,actions=drop"])
def test_unknown_match_syntax_is_refused_not_guessed(match):
    with pytest.raises((OpenFlowError, ValueError)):
        encode_match(match)


@pytest.mark.parametrize("actions", ["resubmit(,30)", "controller", "output:1,goto_table:30,output:2",
                                     "load:0x1->NXM_NX_REG0[]"])
def test_unknown_action_syntax_is_refused_not_guessed(actions):
    with pytest.raises((OpenFlowError, ValueError)):
        encode_instructions(actions)
