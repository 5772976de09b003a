"""The frozen bundle installed by its own ``ferry-route-sync install-cni`` into a host-like CNI
bin dir (Debian's reference plugins beside it): the conflist it writes works through cnitool with
the chained portmap (a host port reaches the Pod) and bandwidth (tbf on the host veth) plugins,
and ``--uninstall`` leaves the dirs as they were."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from lab.tools import cnitool
from tests.ship.helpers import host_bin_dir, run
from tests.support.ovs_instance import OvsInstance, netns

pytestmark = [pytest.mark.root, pytest.mark.slow]
CNITOOL = cnitool()
HOST_PORT, POD_PORT = 18080, 8080
SERVER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, peer = s.accept(); c.sendall(b"hello from the pod"); c.close()
"""
CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
print(c.recv(100).decode())
"""


def test_install_cni_conflist_with_portmap_and_bandwidth(bundle: Path, tmp_path: Path) -> None:
    if not os.access("/usr/lib/cni/portmap", os.X_OK) or not os.access(CNITOOL, os.X_OK):
        pytest.skip("needs Debian's containernetworking-plugins and cnitool")
    bin_dir, conf_dir = host_bin_dir(tmp_path / "bin"), tmp_path / "net.d"
    before = sorted(os.listdir(bin_dir))
    name = f"sp8-{secrets.token_hex(3)}"
    with netns(name) as ns, OvsInstance(name, netns=ns) as ovs:
        over = tmp_path / "ferry-conf.json"
        over.write_text(json.dumps({
            "stateFile": str(tmp_path / "state" / "node-state.json"), "bridge": "br-int", "ovsdb": ovs.db,
            "ovsRunDir": ovs.run_dir, "datapath": "netdev", "logFile": str(tmp_path / "cni.log"),
            "ipam": {"dataDir": str(tmp_path / "ipam"), "ranges": [[{"subnet": "10.244.1.0/24"}]]}}))
        p = run([str(bundle / "ferry-route-sync"), "install-cni", "--cni-bin-dir", str(bin_dir),
                 "--cni-conf-dir", str(conf_dir), "--cni-version", "1.0.0", "--ferry-conf", str(over)])
        conf = json.loads((conf_dir / "10-ferry.conflist").read_text())
        assert [pl["type"] for pl in conf["plugins"]] == ["ferry", "portmap", "bandwidth"], p.stdout
        assert os.path.realpath(bin_dir / "ferry").startswith(str(bin_dir / ".ferry-bundle"))

        pod_ns = f"{ns}-a"
        pod_path = f"/run/netns/{pod_ns}"
        env = dict(os.environ, NETCONFPATH=str(conf_dir), CNI_PATH=str(bin_dir),
                   CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=a", CNI_CACHE_DIR=str(tmp_path / "cache"),
                   CAP_ARGS=json.dumps({
                       "portMappings": [{"hostPort": HOST_PORT, "containerPort": POD_PORT, "protocol": "tcp"}],
                       "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                                     "egressRate": 8_000_000, "egressBurst": 800_000}}))
        run(["ip", "netns", "add", pod_ns])
        server = None
        try:
            add = run(["ip", "netns", "exec", ns, CNITOOL, "add", "ferry", pod_path], env=env)
            result = json.loads(add.stdout)
            host_veth = next(i["name"] for i in result["interfaces"] if not i.get("sandbox"))
            pod_ip = result["ips"][0]["address"].split("/")[0]

            # bandwidth: a token bucket on the host side of the Pod's veth
            qdisc = run(["ip", "netns", "exec", ns, "tc", "qdisc", "show", "dev", host_veth]).stdout
            assert "tbf" in qdisc and "rate 8Mbit" in qdisc, qdisc

            # portmap: the Node's host port reaches the Pod's server
            server = subprocess.Popen(["ip", "netns", "exec", pod_ns, sys.executable, "-c", SERVER, str(POD_PORT)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            gw = "10.244.1.1"  # an address of the Node (the gateway port), not the Pod's
            got = run(["ip", "netns", "exec", ns, sys.executable, "-c", CLIENT, gw, str(HOST_PORT)], timeout=30)
            assert got.stdout.strip() == "hello from the pod"
            nat = run(["ip", "netns", "exec", ns, "iptables-save", "-t", "nat"]).stdout
            assert f"--dport {HOST_PORT}" in nat and f"{pod_ip}:{POD_PORT}" in nat

            run(["ip", "netns", "exec", ns, CNITOOL, "del", "ferry", pod_path], env=env)
            nat = run(["ip", "netns", "exec", ns, "iptables-save", "-t", "nat"]).stdout
            assert f"{pod_ip}:{POD_PORT}" not in nat
        finally:
            if server is not None:
                server.kill()
                server.wait()
            run(["ip", "netns", "del", pod_ns], check=False)

    run([str(bundle / "ferry-route-sync"), "install-cni", "--uninstall", "--cni-bin-dir", str(bin_dir),
         "--cni-conf-dir", str(conf_dir)])
    assert sorted(os.listdir(bin_dir)) == before
    assert os.listdir(conf_dir) == []
