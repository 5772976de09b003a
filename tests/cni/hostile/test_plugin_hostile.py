"""Hostile values through the real plugin (exec'd as a runtime does, on a real Node): the answer
is one spec error JSON or a valid result, never a traceback; a failed call leaves nothing; a
Pod name in OpenFlow syntax lands verbatim in external_ids only and the Pod's flows are exactly
the planned ones; nothing reaches a shell."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni.pipeline import tables as pl
from cni.pipeline.flows import PodPort, pod_flows
from tests.support.podnode import run

pytestmark = pytest.mark.root
MARKER = "/tmp/fx-pwned"
NASTY = ["$(touch /tmp/fx-pwned)", "`touch /tmp/fx-pwned`", "a;touch /tmp/fx-pwned", "a|touch /tmp/fx-pwned",
         "../../../etc/passwd", "x\x00y", "a" * 4096, ",actions=drop", "actions=output:1", "cookie=0x1/0x0",
         "in_port=1,actions=flood", "eth0\n", " ", "*", "ö", "-rf", "--help"]
hostile = st.one_of(st.sampled_from(NASTY), st.text(max_size=40), st.binary(max_size=40).map(
    lambda b: b.decode("utf-8", "surrogateescape")))


def _nothing_left(node) -> list[str]:
    left = [x for x in node.links() if x.startswith(pl.HOST_VETH_PREFIX)]
    if node.bridge in node.ovs.vsctl("list-br").split():
        left += [x for x in node.ports() if x.startswith(pl.HOST_VETH_PREFIX)]
        left += node.flows(pl.Cookie.owner_match(pl.Owner.POD))
    ls = run([f"{node.cni_bin}/ferry-ipam", "ls", "--json", "--data-dir", str(node.ipam_dir)], check=False)
    left += [r["address"] for r in json.loads(ls.stdout or "[]")] if ls.returncode == 0 else []
    return left


def _check_answer(p) -> dict | None:
    out = p.stdout.decode("utf-8", "replace")
    assert "Traceback" not in out
    if p.returncode == 0 and not out.strip():
        return None
    doc = json.loads(out)  # exactly one JSON document
    if p.returncode != 0:
        assert isinstance(doc.get("code"), int) and isinstance(doc.get("msg"), str), doc
    return doc


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cid=st.one_of(st.just("fxgood1"), hostile), ifname=st.one_of(st.just("eth0"), hostile),
       pod=hostile, netns_kind=st.sampled_from(["ok", "dotdot", "hostile", "missing"]),
       prev=st.one_of(st.none(), st.just({"cniVersion": "1.0.0", "interfaces": "x"}),
                      st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
       extra_env=st.dictionaries(st.sampled_from(["CNI_ARGS", "CNI_PATH", "CNI_COMMAND"]), hostile, max_size=2))
def test_hostile_add_answers_in_spec_and_leaves_nothing(fx_node, cid, ifname, pod, netns_kind, prev, extra_env):
    ns = f"{fx_node.name}-fz"
    if not os.path.exists(f"/run/netns/{ns}"):
        run(["ip", "netns", "add", ns])
    path = {"ok": f"/run/netns/{ns}", "dotdot": f"/run/netns/../netns/{ns}",
            "hostile": f"/run/netns/{pod}", "missing": "/run/netns/fx-none;touch /tmp/fx-pwned"}[netns_kind]
    conf = dict(fx_node.plugin_conf(), cniVersion="1.0.0", name="ferrynet")
    if prev is not None:
        conf["prevResult"] = prev
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid,
           "CNI_NETNS": path, "CNI_IFNAME": ifname, "CNI_PATH": fx_node.cni_bin,
           "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod}"}
    env.update(extra_env)
    env = {k: v for k, v in env.items() if "\x00" not in k + v}
    try:
        env = {k: v.encode("utf-8", "surrogateescape").decode("utf-8", "surrogateescape") for k, v in env.items()}
        p = fx_node.direct("ADD", path, cid, env=env, stdin=json.dumps(conf).encode())
    except ValueError:  # the OS refuses the value (e.g. an embedded NUL): nothing to test
        return
    doc = _check_answer(p)
    if p.returncode == 0:  # it was valid after all: DEL must take everything away again
        assert doc and doc.get("ips")
        env2 = dict(env, CNI_COMMAND="DEL")
        d = fx_node.direct("DEL", path, cid, env=env2, stdin=json.dumps(conf).encode())
        assert d.returncode == 0, d.stdout
    assert not os.path.exists(MARKER), "a value reached a shell"
    assert _nothing_left(fx_node) == []
    run(["ip", "-n", ns, "link", "del", "eth0"], check=False)


@pytest.mark.parametrize("pod_name", [",actions=drop", "x,cookie=0x1,actions=output:1", "a;b", "$(id)",
                                      "web\nactions=drop", "../../etc"])
def test_openflow_syntax_in_a_pod_name_stays_data(fx_node, pod_name):
    args = f"K8S_POD_NAMESPACE=ns,actions=flood;K8S_POD_NAME={pod_name}"
    expect_name = pod_name.split(";")[0]  # ';' separates CNI_ARGS pairs
    try:
        pod = fx_node.add_pod_as("of", "fxofsyntax1", args)
    except AssertionError as e:  # refusing the value is fine too, as long as nothing is left
        assert "Traceback" not in str(e)
        assert _nothing_left(fx_node) == []
        return
    got = json.loads(fx_node.ovs.vsctl("--format=json", "--columns=external_ids", "find", "port",
                                       f"name={pod.host_veth}"))
    ids = dict(got["data"][0][0][1])
    assert ids[pl.EXT_POD_NAME] == expect_name and ids[pl.EXT_POD_NAMESPACE] == "ns,actions=flood"
    cookie = pl.pod_cookie("fxofsyntax1", "eth0")
    installed = fx_node.flows(cookie.match())
    ofport = int(fx_node.ovs.vsctl("get", "interface", pod.host_veth, "ofport"))
    gw_mac = fx_node.exec("cat", "/sys/class/net/ferry-gw0/address").stdout.strip()
    gw_ofport = int(fx_node.ovs.vsctl("get", "interface", pl.GATEWAY_PORT, "ofport"))
    try:
        planned = pod_flows(PodPort(cookie, ofport, pod.mac, tuple(i["address"] for i in pod.result["ips"])),
                            gw_mac, gw_ofport)  # type: ignore[call-arg]
    except TypeError:
        planned = pod_flows(PodPort(cookie, ofport, pod.mac, tuple(i["address"] for i in pod.result["ips"])), gw_mac)
    assert len(installed) == len(planned)
    everything = "\n".join(fx_node.flows())
    for bad in ("actions=flood", "FLOOD", "cookie=0x1,", expect_name if len(expect_name) > 4 else "\x00"):
        assert bad not in everything
    assert not os.path.exists(MARKER)
