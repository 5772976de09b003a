"""deploy/ferry.yaml against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown
fields fail), plus what the schemas cannot say: the wiring between the parts."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate as kv
import pytest
import yaml

from routesync import config as rs_config
from routesync.health import DEFAULT_PORT
from routesync.policy import peerslice
from tests.ship.helpers import ROOT

MANIFEST = ROOT / "deploy" / "ferry.yaml"


OVS = "DaemonSet/ferry-openvswitch"  # the Node's Open vSwitch; "DaemonSet" is route-sync's, ferry


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    out = {}
    for d in yaml.safe_load_all(MANIFEST.read_text()):
        key = OVS if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "ferry-openvswitch" else d["kind"]
        assert key not in out, key
        out[key] = d
    return out


def test_every_document_validates_strictly(docs: dict[str, dict]) -> None:
    assert set(docs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", OVS}
    for kind, d in docs.items():
        assert kv.validate(d, kv.latest_version(), strict=True), kind


def test_the_validator_catches_a_bad_field(docs: dict[str, dict]) -> None:
    bad = yaml.safe_load(yaml.safe_dump(docs["DaemonSet"]))
    bad["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)
    bad = yaml.safe_load(yaml.safe_dump(docs["DaemonSet"]))
    bad["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)


def test_daemonset_wiring(docs: dict[str, dict]) -> None:
    ds = docs["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == docs["ServiceAccount"]["metadata"]["name"]
    init, wait = pod["initContainers"]
    assert init["command"][:2] == ["/opt/ferry/ferry-route-sync", "install-cni"]
    assert init["securityContext"]["privileged"] is True
    # cniVersion: what the Node's runtime reads, found through this Node's object
    assert init["command"][init["command"].index("--cni-version") + 1] == "auto"
    env = {e["name"]: e for e in init["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    i = init["command"].index
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts[init["command"][i("--cni-bin-dir") + 1]]]["hostPath"]["path"] == "/opt/cni/bin"
    assert volumes[mounts[init["command"][i("--cni-conf-dir") + 1]]]["hostPath"]["path"] == "/etc/cni/net.d"
    (rs,) = pod["containers"]
    assert rs["securityContext"]["privileged"] is True
    port = int(rs["command"][rs["command"].index("--metrics-port") + 1])
    assert port == DEFAULT_PORT
    assert rs["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port, "host": "127.0.0.1"}
    assert rs["readinessProbe"]["httpGet"]["path"] == "/readyz" and rs["readinessProbe"]["httpGet"]["port"] == port
    # the config the container reads is the ConfigMap's route-sync.yaml
    cfg_path = rs["command"][rs["command"].index("--config") + 1]
    cfg_mount = next(m for m in rs["volumeMounts"] if cfg_path.startswith(m["mountPath"] + "/"))
    assert volumes[cfg_mount["name"]]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    assert Path(cfg_path).name in docs["ConfigMap"]["data"]
    # route-sync starts once the Node's Open vSwitch answers on the run directory it mounts
    assert wait["command"][:2] == ["sh", "-c"] and "ovs-appctl" in wait["command"][2]
    assert {m["mountPath"]: m["name"] for m in wait["volumeMounts"]} == {"/var/run/openvswitch": "ovs-run"}
    rs_mounts = {m["mountPath"]: m["name"] for m in rs["volumeMounts"]}
    cfg = rs_config.from_dict({**yaml.safe_load(docs["ConfigMap"]["data"]["route-sync.yaml"]), "nodeName": "n1"})
    assert cfg.ovs_daemons == rs_config.OVS_FERRY
    assert rs_mounts[cfg.ovs_run_dir] == "ovs-run" and volumes["ovs-run"]["hostPath"]["path"] == cfg.ovs_run_dir


def test_open_vswitch_runs_apart_and_a_rollout_leaves_it_running(docs: dict[str, dict]) -> None:
    """The Node's Open vSwitch is a DaemonSet of its own whose Pods a new image does not replace
    (OnDelete): route-sync's rollout leaves the switch forwarding. It reads the same config, its run
    directory and database on the host paths route-sync (and the plugin, on the host) use, and
    needs no API access."""
    ds, rs_ds = docs[OVS], docs["DaemonSet"]
    assert ds["spec"]["updateStrategy"] == {"type": "OnDelete"}
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    # the two selectors pick apart: neither DaemonSet adopts the other's Pods
    for a, b in ((ds, rs_ds), (rs_ds, ds)):
        assert not (a["spec"]["selector"]["matchLabels"].items() <= b["spec"]["template"]["metadata"]["labels"].items())
    pod, rs_pod = ds["spec"]["template"]["spec"], rs_ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod and "initContainers" not in pod
    assert pod["tolerations"] == rs_pod["tolerations"] and pod["priorityClassName"] == rs_pod["priorityClassName"]
    (ovs,) = pod["containers"]
    (rs,) = rs_pod["containers"]
    assert ovs["image"] == rs["image"] and ovs["securityContext"]["privileged"] is True
    cfg_path = rs["command"][rs["command"].index("--config") + 1]
    assert ovs["command"] == ["/opt/ferry/ferry-route-sync", "ovs", "--config", cfg_path]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert ovs[probe]["exec"]["command"][:2] == ["sh", "-c"], probe
    volumes = {v["name"]: v for v in pod["volumes"]}
    rs_volumes = {v["name"]: v for v in rs_pod["volumes"]}
    ovs_mounts = {m["mountPath"]: m["name"] for m in ovs["volumeMounts"]}
    cfg = rs_config.from_dict({**yaml.safe_load(docs["ConfigMap"]["data"]["route-sync.yaml"]), "nodeName": "n1"})
    assert volumes[ovs_mounts[cfg.ovs_run_dir]] == rs_volumes["ovs-run"]
    assert volumes["config"] == rs_volumes["config"]
    for path in (cfg.ovs_database, cfg.ovs_log_dir + "/", cfg.state_file):  # host paths: a restart keeps them
        mount = next(m for m in ovs_mounts if path.startswith(m + "/"))
        assert "hostPath" in volumes[ovs_mounts[mount]], path
        assert volumes[ovs_mounts[mount]] == rs_volumes[ovs_mounts[mount]], path


def test_configmap_is_a_valid_route_sync_config(docs: dict[str, dict]) -> None:
    raw = yaml.safe_load(docs["ConfigMap"]["data"]["route-sync.yaml"])
    cfg = rs_config.from_dict({**raw, "nodeName": "n1"})
    assert cfg.node_source.type == "kubernetes"
    assert cfg.state_file == "/var/run/ferry/node-state.json"  # what the conflist template's ferry reads
    ds_mounts = {m["mountPath"] for m in docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert str(Path(cfg.state_file).parent) in ds_mounts
    assert cfg.ovs_run_dir in ds_mounts


def test_rbac_is_exactly_what_ferry_uses(docs: dict[str, dict]) -> None:
    """Nodes (route-sync's peers and its own annotations) and, for policy, read access to Pods,
    Namespaces, NetworkPolicies, ServiceCIDRs, ClusterNetworkPolicies and PeerSlices (with
    ``policyPeers: peerSlices``, :mod:`routesync.policy.watch`): nothing more (the kube e2e tests
    run under this role)."""
    grants = {(g, r, v) for rule in docs["ClusterRole"]["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    read = ("get", "list", "watch")
    want = {("", "nodes", v) for v in (*read, "patch")}
    want |= {("", r, v) for r in ("pods", "namespaces") for v in read}
    want |= {("networking.k8s.io", r, v) for r in ("networkpolicies", "servicecidrs") for v in read}
    want |= {("policy.networking.k8s.io", "clusternetworkpolicies", v) for v in read}
    want |= {(peerslice.GROUP, peerslice.PLURAL, v) for v in read}
    assert grants == want
    b = docs["ClusterRoleBinding"]
    assert b["roleRef"]["name"] == docs["ClusterRole"]["metadata"]["name"]
    (subject,) = b["subjects"]
    sa = docs["ServiceAccount"]["metadata"]
    assert (subject["kind"], subject["name"], subject["namespace"]) == ("ServiceAccount", sa["name"], sa["namespace"])


CONTROLLER = ROOT / "deploy" / "ferry-controller.yaml"


@pytest.fixture(scope="module")
def controller_docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(CONTROLLER.read_text()) if d}


def test_the_controllers_documents_validate_strictly(controller_docs: dict[str, dict]) -> None:
    assert set(controller_docs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                                    "Deployment"}
    for kind, d in controller_docs.items():
        assert kv.validate(d, kv.latest_version(), strict=True), kind


def test_the_controllers_wiring(controller_docs: dict[str, dict], docs: dict[str, dict]) -> None:
    """The Deployment runs the bundle's ferry-controller from route-sync's image, under its own
    account, bound to its ClusterRole and to the Role of the Lease it names; on the host's
    network as route-sync (it must reach the API server before Ferry gives Pods a network)."""
    d = controller_docs["Deployment"]
    pod = d["spec"]["template"]["spec"]
    sa = controller_docs["ServiceAccount"]["metadata"]
    assert d["spec"]["selector"]["matchLabels"].items() <= d["spec"]["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == sa["name"] and pod["hostNetwork"] is True
    assert d["spec"]["replicas"] >= 2
    (c,) = pod["containers"]
    assert c["image"] == docs["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["image"]
    cmd = c["command"]
    assert cmd[0] == "/opt/ferry/ferry-controller"
    lease_ns, lease_name = cmd[cmd.index("--lease-namespace") + 1], cmd[cmd.index("--lease-name") + 1]
    assert {e["name"]: e["valueFrom"] for e in c["env"]} == {"POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}}}
    role, role_binding = controller_docs["Role"], controller_docs["RoleBinding"]
    assert role["metadata"]["namespace"] == role_binding["metadata"]["namespace"] == lease_ns
    assert [r.get("resourceNames") for r in role["rules"]] == [[lease_name], None]
    for binding, kind in ((controller_docs["ClusterRoleBinding"], "ClusterRole"), (role_binding, "Role")):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": kind,
                                      "name": controller_docs[kind]["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    assert {"ferry.io"} <= {g for r in controller_docs["ClusterRole"]["rules"] for g in r["apiGroups"]}
    assert peerslice.GROUP == "ferry.io"
