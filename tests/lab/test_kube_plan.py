"""The cluster's plan, spec, overlay, images and certificates, without root (pure functions and
files in a temporary directory)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab import topology as topo_mod
from lab.kube import manifests, ociimage, pki, plan, release, spec
from lab.kube.cluster import router_routes
from tests.e2e.kube.helpers import topology


def parsed(**kw: object) -> topo_mod.Topology:
    return topo_mod.parse(topology({"trafficEncapMode": "encap"}, **kw))  # type: ignore[arg-type]


def test_spec_defaults_and_errors() -> None:
    assert spec.parse(None) is None and spec.parse(False) is None
    assert spec.parse(True) == spec.KubeSpec()
    assert spec.parse({"installer": "helm"}).installer == "helm"  # type: ignore[union-attr]
    assert spec.parse({"installer": "helm", "release": "v0.1.0"}).release == "v0.1.0"  # type: ignore[union-attr]
    for bad, key in (({"x": 1}, "unknown keys"), ({"serviceCIDR": "fd00::/64"}, "serviceCIDR"),
                     ({"apiPort": 0}, "apiPort"), ({"imageTag": "a:b"}, "imageTag"),
                     ({"joinLater": "node-4"}, "joinLater"), ({"installer": "kustomize"}, "installer"),
                     ({"installer": "helm", "cni": "bridge"}, "installer"),
                     ({"release": "v0.1.0"}, "release v0.1.0: only with installer helm"),
                     ({"installer": "helm", "release": "0.1.0"}, "release '0.1.0': a release tag"),
                     ({"installer": "helm", "release": "v0.1.0", "imageTag": "x"}, "not imageTag"),
                     ({"controllerDelivery": "gossip"}, "controllerDelivery 'gossip': one of labels, subscription"),
                     ({"installer": "helm", "release": "v0.1.0", "controllerDelivery": "subscription"},
                      "controllerDelivery subscription: this tree's controller")):
        with pytest.raises(spec.KubeSpecError, match=key):
            spec.parse(bad)


def test_topology_checks_the_kubernetes_block() -> None:
    doc = topology({"trafficEncapMode": "encap"}, join_later=("node-9",))
    with pytest.raises(topo_mod.TopologyError, match="joinLater: no Node named node-9"):
        topo_mod.parse(doc)
    doc = topology({"trafficEncapMode": "encap"})
    doc["routeSync"] = None
    with pytest.raises(topo_mod.TopologyError, match="needs a routeSync block"):
        topo_mod.parse(doc)
    t = parsed(nodes=4, join_later=("node-4",))
    assert t.kubernetes is not None and t.kubernetes.join_later == ("node-4",)
    assert topo_mod.parse(topo_mod.to_doc(t)) == t
    doc = topology({"trafficEncapMode": "encap"})
    doc["kubernetes"]["controllerDelivery"] = "subscription"
    with pytest.raises(topo_mod.TopologyError, match="controllerDelivery subscription: only with routeSync"):
        topo_mod.parse(doc)
    doc["routeSync"]["policyPeers"] = "peerSlices"
    t = topo_mod.parse(doc)
    assert t.kubernetes is not None and t.kubernetes.controller_delivery == "subscription"
    assert topo_mod.parse(topo_mod.to_doc(t)) == t


def test_controller_runs_with_the_topologys_delivery() -> None:
    """ferry-controller's ``--delivery`` replaced, not appended twice; the rest of its command as shipped."""
    shipped = next(d for d in manifests.load(manifests.CONTROLLER_MANIFEST) if d["kind"] == "Deployment")
    shipped_cmd = shipped["spec"]["template"]["spec"]["containers"][0]["command"]
    for how in ("labels", "subscription"):
        overlay = manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16",), {"policyPeers": "peerSlices"},
                                    controller_delivery=how)
        d = next(d for d in manifests.controller_docs(overlay) if d["kind"] == "Deployment")
        cmd = d["spec"]["template"]["spec"]["containers"][0]["command"]
        assert cmd.count("--delivery") == 1 and cmd[cmd.index("--delivery") + 1] == how
        assert [a for a in cmd if a not in ("labels", "subscription")] == \
            [a for a in shipped_cmd if a not in ("labels", "subscription")]
    assert manifests.with_flag(["c", "--x", "1"], "--y", "2") == ["c", "--x", "1", "--y", "2"]


def test_plan_wires_components_to_each_other(tmp_path: Path) -> None:
    t = parsed()
    assert t.kubernetes is not None
    p = plan.plan("lab1", str(tmp_path), t, t.kubernetes, "/tools")
    api = p.process("kube-apiserver")
    assert p.api_url == "https://192.168.99.2:6443" and api.netns == "lab1-ext"
    assert "--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112" in api.argv  # dual-stack cluster
    kcm = p.process("kube-controller-manager").argv
    assert "--allocate-node-cidrs=true" in kcm and "--cluster-cidr=10.244.0.0/16,fd00:10:244::/48" in kcm
    assert "--node-cidr-mask-size-ipv4=24" in kcm and "--node-cidr-mask-size-ipv6=64" in kcm
    kubelet = p.process("node-3/kubelet")
    assert kubelet.netns == "lab1-node-3" and kubelet.mount_ns == p.node("node-3").mount_ns
    assert "--node-ip=192.168.88.13,fd00:88::d" in kubelet.argv
    n = p.node("node-1")
    targets = [dst for _src, dst in n.binds]
    assert len(targets) == len(set(targets)) and "/etc/cni/net.d" in targets and "/run/openvswitch" in targets
    assert {d: s for s, d in n.binds}["/run/openvswitch"].endswith("nodes/node-1/ovs")
    assert n.kubelet_config["cgroupRoot"] == "/ferry-lab/lab1/node-1"
    assert {p.node(x).cgroup_root for x in ("node-1", "node-2", "node-3")} == {
        f"/ferry-lab/lab1/node-{i}" for i in (1, 2, 3)}
    assert 'sandbox_image = "ferry.local/pause:1"' in n.containerd_config
    assert set(p.kubeconfigs) >= {p.admin_kubeconfig}


def test_services_kube_proxy_and_dns_in_the_plan(tmp_path: Path) -> None:
    """kube-proxy on every Node in the spec's mode, with its own identity and the cluster CIDRs;
    kube-dns on the 10th address of each Service CIDR, named in every kubelet's clusterDNS."""
    t = parsed()
    assert t.kubernetes is not None and t.kubernetes.kube_proxy == "iptables"
    p = plan.plan("lab1", str(tmp_path), t, t.kubernetes, "/tools")
    assert p.dns_ips == ("10.96.0.10", "fd00:10:96::a") and p.dns_ip == "10.96.0.10"
    for name in ("node-1", "node-2", "node-3"):
        n = p.node(name)
        proxy = p.process(f"{name}/kube-proxy")
        assert proxy.argv[0] == "/tools/kube-proxy" and f"--hostname-override={name}" in proxy.argv
        assert proxy.netns == f"lab1-{name}" and proxy.mount_ns == n.mount_ns
        assert n.kube_proxy_config is not None and n.kube_proxy_config["mode"] == "iptables"
        assert n.kube_proxy_config["clusterCIDR"] == "10.244.0.0/16,fd00:10:244::/48"
        assert n.kube_proxy_config["conntrack"]["maxPerCore"] == 0
        assert n.kubelet_config["clusterDNS"] == ["10.96.0.10", "fd00:10:96::a"]
    assert ("kube-proxy", plan.KUBE_PROXY_USER) in p.kubeconfigs.values()
    nft = spec.parse({"kubeProxy": "nftables", "serviceCIDR": "10.100.0.0/20"})
    assert nft is not None and nft.kube_proxy == "nftables"
    assert plan.service_cidrs(t, nft) == ("10.100.0.0/20",)
    none = spec.parse({"kubeProxy": "none"})
    assert none is not None and not none.services
    p = plan.plan("lab1", str(tmp_path), t, none, "/tools")
    assert p.dns_ips == () and all(len(n.processes) == 2 for n in p.nodes)
    assert all("clusterDNS" not in n.kubelet_config for n in p.nodes)
    for bad in ("10.96.0.0/16,10.97.0.0/16", "fd00::/100", "10.96.0.0/8", [1, 2, 3]):
        with pytest.raises(spec.KubeSpecError, match="serviceCIDR"):
            spec.parse({"serviceCIDR": bad})
    with pytest.raises(spec.KubeSpecError, match="kubeProxy"):
        spec.parse({"kubeProxy": "ipvs"})


def test_dns_objects_are_kubeadms() -> None:
    from lab.kube import dns

    docs = {d["kind"]: d for d in dns.documents(("10.96.0.10", "fd00:10:96::a"), "cluster.local")}
    svc = docs["Service"]
    assert svc["metadata"]["name"] == "kube-dns" and svc["spec"]["clusterIPs"] == ["10.96.0.10", "fd00:10:96::a"]
    assert {(p["port"], p["protocol"]) for p in svc["spec"]["ports"]} >= {(53, "UDP"), (53, "TCP")}
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in docs["ConfigMap"]["data"]["Corefile"]
    assert "forward" not in docs["ConfigMap"]["data"]["Corefile"]  # no upstream resolver here
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    assert pod["dnsPolicy"] == "Default" and pod["containers"][0]["image"] == dns.COREDNS_IMAGE


def test_mask_sizes_stay_within_the_controllers_limit() -> None:
    assert plan.mask_sizes(("10.244.0.0/16", "fd00:10:244::/48")) == {4: 24, 6: 64}
    assert plan.mask_sizes(("10.0.0.0/8",)) == {4: 24}
    assert plan.mask_sizes(("fd00::/32",)) == {6: 48}  # /64 would be 32 bits below: the limit is 16
    assert plan.mask_sizes(("10.244.0.0/25",)) == {4: 26}


def test_overlay_changes_only_what_the_lab_needs() -> None:
    docs = manifests.load()
    out = manifests.apply_overlay(docs, manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16",),
                                                          {"trafficEncapMode": "hybrid"}, "ferry-cni/ferry:x"))
    conf = yaml.safe_load(next(d for d in out if d["kind"] == "ConfigMap")["data"][manifests.CONFIG_KEY])
    assert conf["datapathType"] == "netdev" and conf["trafficEncapMode"] == "hybrid"
    assert conf["clusterCIDRs"] == ["10.244.0.0/16"] and conf["nodeSource"] == {"type": "kubernetes"}
    assert [d["metadata"]["name"] for d in manifests.daemonsets(out)] == [manifests.OVS_DAEMONSET,
                                                                          manifests.ROUTE_SYNC_DAEMONSET]
    for ds in manifests.daemonsets(out):
        pod = ds["spec"]["template"]["spec"]
        for c in (*pod.get("initContainers", []), *pod["containers"]):
            assert c["image"] == "ferry-cni/ferry:x"
            if c["name"] == "wait-openvswitch":  # a shell loop: no env, none added
                assert "env" not in c
                continue
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["KUBERNETES_SERVICE_HOST"] == "192.168.99.2" and "NODE_NAME" in env
    # everything else as shipped
    strip = lambda ds: {k: v for k, v in ds.items() if k != "data" and k != "spec"}
    assert [strip(d) for d in out] == [strip(d) for d in docs]
    assert [d for d in out if d["kind"] in ("ClusterRole", "ServiceAccount", "ClusterRoleBinding")] == \
        [d for d in docs if d["kind"] in ("ClusterRole", "ServiceAccount", "ClusterRoleBinding")]


def test_router_routes_follow_the_node_objects() -> None:
    nodes = {"node-2": (("10.244.0.0/24", "fd00:10:244::/64"), ("192.168.77.12", "fd00:77::c")),
             "node-1": (("10.244.1.0/24",), ("192.168.77.11",)), "node-9": ((), ("1.2.3.4",))}
    assert router_routes(nodes) == ["10.244.1.0/24 via 192.168.77.11", "10.244.0.0/24 via 192.168.77.12",
                                    "fd00:10:244::/64 via fd00:77::c"]


def test_oci_archive_is_deterministic_and_complete(tmp_path: Path) -> None:
    img = ociimage.busybox_image("ferry.local/busybox:1")
    a, b = ociimage.archive(img), ociimage.archive(img)
    assert a == b
    with tarfile.open(fileobj=io.BytesIO(a)) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        ref = index["manifests"][0]
        assert ref["annotations"]["io.containerd.image.name"] == "ferry.local/busybox:1"
        manifest = json.loads(tar.extractfile("blobs/sha256/" + ref["digest"].split(":")[1]).read())  # type: ignore[union-attr]
        layer = tar.extractfile("blobs/sha256/" + manifest["layers"][0]["digest"].split(":")[1]).read()  # type: ignore[union-attr]
    with tarfile.open(fileobj=io.BytesIO(layer)) as lt:
        names = {m.name: m for m in lt.getmembers()}
    assert names["bin/busybox"].isfile() and names["bin/sh"].issym() and names["bin/sh"].linkname == "busybox"


def test_certificates_name_who_each_client_is(tmp_path: Path) -> None:
    ca = pki.Authority(str(tmp_path))
    crt, _key = ca.issue("node-1", "system:node:node-1", ["system:nodes"])
    srv, _ = ca.issue("apiserver", "kube-apiserver", server_names=["192.168.99.2", "kubernetes"], client=False)
    c = x509.load_pem_x509_certificate(Path(crt).read_bytes())
    assert c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node-1"
    assert c.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    c.verify_directly_issued_by(ca.cert)
    s = x509.load_pem_x509_certificate(Path(srv).read_bytes())
    eku = s.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = s.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["192.168.99.2"]
    # the CA is reused, not regenerated, by a second Authority on the same directory
    assert pki.Authority(str(tmp_path)).cert == ca.cert


def test_api_server_proxies_to_aggregated_apis_as_kubeadms_front_proxy(tmp_path: Path) -> None:
    """kubeadm's flags for aggregated APIs, every file they name written by the lab's credentials,
    the front proxy's client certificate (CN front-proxy-client, the one allowed name) issued by a
    CA of its own, not the cluster's; and the API server dials an APIService's endpoints (Pod IPs)."""
    from lab.kube.cluster import Cluster

    t = parsed()
    assert t.kubernetes is not None
    p = plan.plan("lab1", str(tmp_path), t, t.kubernetes, "/tools")
    argv = p.process("kube-apiserver").argv
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    fp = Path(p.front_proxy_pki)
    assert fp.parent == Path(p.pki)
    assert {k: v for k, v in flags.items() if k.startswith(("requestheader-", "proxy-client-"))} == {
        "requestheader-client-ca-file": str(fp / "ca.crt"), "requestheader-allowed-names": "front-proxy-client",
        "requestheader-extra-headers-prefix": "X-Remote-Extra-", "requestheader-group-headers": "X-Remote-Group",
        "requestheader-username-headers": "X-Remote-User", "proxy-client-cert-file": str(fp / "front-proxy-client.crt"),
        "proxy-client-key-file": str(fp / "front-proxy-client.key")}
    assert flags["enable-aggregator-routing"] == "true"
    Cluster(p, None, lambda _msg: None).credentials(plan.server_names(t, t.kubernetes))  # type: ignore[arg-type]
    named = [v for k, v in flags.items() if k.endswith(("-file", "-certificate", "-key", "-authority"))]
    assert len(named) == 11 and all(Path(f).is_file() for f in named), [f for f in named if not Path(f).is_file()]
    front_ca = x509.load_pem_x509_certificate((fp / "ca.crt").read_bytes())
    cluster_ca = x509.load_pem_x509_certificate((Path(p.pki) / "ca.crt").read_bytes())
    assert front_ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "front-proxy-ca"
    assert front_ca.public_key() != cluster_ca.public_key()
    client = x509.load_pem_x509_certificate((fp / "front-proxy-client.crt").read_bytes())
    assert client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "front-proxy-client"
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    client.verify_directly_issued_by(front_ca)
    with pytest.raises(ValueError):
        client.verify_directly_issued_by(cluster_ca)


def test_network_policy_only_on_kubernetes_has_a_primary_cni() -> None:
    """networkPolicyOnly on a Kubernetes lab: accepted; each Node gets Debian's ptp + host-local on
    the Pod CIDRs the API gave it (install-cni chains Ferry after it), and no nodePodRoutes from
    the topology's own Pod CIDRs (the controller-manager picks them: the router routes them)."""
    from lab import netplan

    doc = topology({"trafficEncapMode": "networkPolicyOnly"}, True)
    doc["nodePodRoutes"] = True
    t = topo_mod.parse(doc)
    assert t.chained and t.kubernetes is not None
    assert "ptp" in plan.NODE_CNI_PLUGINS and plan.PRIMARY_CONFLIST > "00-ferry-chained.conflist"
    conf = plan.ptp_conflist(("10.244.3.0/24", "fd00:10:244:3::/64"))
    (ptp,) = conf["plugins"]
    assert (conf["cniVersion"], ptp["type"], ptp["ipMasq"]) == ("1.0.0", "ptp", False)
    assert ptp["ipam"] == {"type": "host-local",
                           "ranges": [[{"subnet": "10.244.3.0/24"}], [{"subnet": "fd00:10:244:3::/64"}]],
                           "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}
    cmds = netplan.plan("tp", t).stages[1][topo_mod.node_netns("tp", "node-1")]
    assert [c for c in cmds if "10.244." in c] == [], cmds


def test_the_previous_release_is_a_tag_and_its_build_lives_under_build_release() -> None:
    tag = release.previous()
    assert spec.RELEASE_TAG.match(tag)
    assert release.chart(tag).endswith(f"build/release/{tag}/src/deploy/helm/ferry")
    assert release.image_archive(tag).endswith(f"build/release/{tag}/image.tar")


def test_the_nodes_datapath_reaches_the_configmap_and_must_be_one_on_kubernetes() -> None:
    from lab.kube import lab_cluster
    from tests.e2e.kube import rollout

    for dp in ("netdev", "system"):
        topo = topo_mod.parse({**topology({"trafficEncapMode": "encap"}), "datapath": dp})
        keys = lab_cluster.route_sync_keys(topo)
        assert keys["datapathType"] == dp
        overlay = manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16",), keys)
        out = manifests.apply_overlay(manifests.load(), overlay)
        conf = yaml.safe_load(next(d for d in out if d["kind"] == "ConfigMap")["data"][manifests.CONFIG_KEY])
        assert conf["datapathType"] == dp
        assert manifests.helm_values(overlay)["config"]["datapathType"] == dp
    mixed = topology({"trafficEncapMode": "encap"})
    mixed["nodes"][0]["datapath"] = "system"  # type: ignore[index]
    with pytest.raises(topo_mod.TopologyError, match=r"nodes\[\]\.datapath: one on a Kubernetes lab.*node-1 system"):
        topo_mod.parse(mixed)
    # the event tests take theirs from FERRY_EVENT_DATAPATH, netdev when unset; a bad value names the variable
    assert rollout.mode_topology("encap-vxlan", "")["datapath"] == "netdev"
    assert rollout.mode_topology("noEncap-fastPath", "system")["datapath"] == "system"
    with pytest.raises(ValueError, match="FERRY_EVENT_DATAPATH: 'kernel': one of netdev, system"):
        rollout.datapath("kernel")
