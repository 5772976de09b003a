"""deploy/helm/ferry, rendered by the pinned Helm (tools/helm, ``build/tools/helm``): with the default
values the same objects as deploy/ferry.yaml; a values' route-sync config that route-sync reads as it
reads the same file written by hand; bad values refused by the chart's schema, naming the field;
the lab's overlay as values equal to the overlay applied to deploy/ferry.yaml; ``helm lint`` clean."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml

from cni.pipeline import modes
from lab import tools
from lab.kube import manifests
from routesync import config as rs_config
from tests.ship.helpers import ROOT

CHART = ROOT / "deploy" / "helm" / "ferry"
MANIFEST = ROOT / "deploy" / "ferry.yaml"
CONTROLLER_MANIFEST = ROOT / "deploy" / "ferry-controller.yaml"


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def helm(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = tools.tool("helm")
    if not os.access(exe, os.X_OK):  # .ci/install.sh builds it: its absence is a broken install, not a skip
        pytest.fail(f"no helm at {exe}: run .ci/install.sh (tools/build-go-tools.sh helm builds it)")
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def render(home: Path, *args: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    extra: list[str] = []
    if values is not None:
        path = home / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        extra = ["--values", str(path)]
    cp = helm(home, "template", manifests.RELEASE, str(CHART), "--namespace", manifests.NAMESPACE, *extra, *args)
    assert cp.returncode == 0, cp.stderr
    return [d for d in yaml.safe_load_all(cp.stdout) if d]


def by_object(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each object by kind and name, the ConfigMap's route-sync.yaml parsed (its text is not the point)."""
    out = {}
    for d in docs:
        d = yaml.safe_load(yaml.safe_dump(d))
        if d["kind"] == "ConfigMap":
            d["data"][manifests.CONFIG_KEY] = yaml.safe_load(d["data"][manifests.CONFIG_KEY])
        out[(d["kind"], d["metadata"]["name"])] = d
    return out


def config_map_text(docs: list[dict[str, Any]]) -> str:
    return str(next(d for d in docs if d["kind"] == "ConfigMap")["data"][manifests.CONFIG_KEY])


def test_default_values_render_deploy_ferry_yaml(helm_home: Path) -> None:
    rendered = by_object(render(helm_home))
    shipped = by_object(manifests.load(str(MANIFEST)))
    assert sorted(rendered) == sorted(shipped)
    for key, doc in shipped.items():
        assert rendered[key] == doc, key


def test_controller_enabled_renders_deploy_ferry_controller_yaml_too(helm_home: Path) -> None:
    """``controller.enabled``: deploy/ferry.yaml's objects and deploy/ferry-controller.yaml's, the same."""
    docs = render(helm_home, values={"controller": {"enabled": True}})
    rendered = by_object(docs)
    shipped = by_object([*manifests.load(str(MANIFEST)), *manifests.load(str(CONTROLLER_MANIFEST))])
    assert sorted(rendered) == sorted(shipped)
    for key, doc in shipped.items():
        assert rendered[key] == doc, key
    for d in docs:
        assert kv.validate(d, kv.latest_version(), strict=True), d["kind"]
    extra = [{"name": "KUBERNETES_SERVICE_HOST", "value": "192.0.2.10"}]  # the API server's own address
    docs = render(helm_home, values={"controller": {"enabled": True, "replicas": 3, "delivery": "subscription"},
                                     "extraEnv": extra})
    d = by_object(docs)[("Deployment", "ferry-controller")]
    assert d["spec"]["replicas"] == 3
    assert d["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--delivery", "subscription"]
    assert [e["name"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"]] == ["POD_NAME",
                                                                                        "KUBERNETES_SERVICE_HOST"]
    for d in docs:
        assert kv.validate(d, kv.latest_version(), strict=True), d["kind"]


def test_chart_version_is_the_shipped_image_tag() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    tag = manifests.shipped_image(manifests.load(str(MANIFEST))).rsplit(":", 1)[1]
    assert (chart["version"], chart["appVersion"]) == (tag, tag)


HAND_WRITTEN = """\
trafficEncapMode: noEncap
noSNAT: true
fastPath: true
tunnelType: vxlan
transportInterface: eth1
transportVLAN: 100
datapathType: system
bridge: br-int
ovsdb: unix:/var/run/openvswitch/db.sock
ovsRunDir: /var/run/openvswitch
stateFile: /var/run/ferry/node-state.json
clusterCIDRs: [10.244.0.0/16, fd00:10:244::/56]
serviceCIDRs: [10.96.0.0/12]
bgp:
  localASN: 64512
  peers:
    - {address: 192.168.77.1, asn: 65000, holdTime: 9, password: s3cret}
    - {address: defaultGateway, asn: 4200000000, addressFamily: ipv6}
  gracefulRestart: 120
trafficEncryptionMode: wireguard
wireguard: {startUserspace: false, port: 51821, persistentKeepalive: 25}
ovsDaemons: host
networkPolicyDeniedLog: {enabled: true, rate: 5, burst: 50}
nodeSource: {type: kubernetes}
resyncSeconds: 30
"""


def test_non_default_values_give_route_sync_the_config_of_the_hand_written_file(
        helm_home: Path, tmp_path: Path) -> None:
    values = {"config": {
        "trafficEncapMode": "noEncap", "noSNAT": True, "fastPath": True, "transportInterface": "eth1",
        "clusterCIDRs": ["10.244.0.0/16", "fd00:10:244::/56"],
        "bgp": {"localASN": 64512, "gracefulRestart": 120,
                "peers": [{"address": "192.168.77.1", "asn": 65000, "holdTime": 9, "password": "s3cret"},
                          {"address": "defaultGateway", "asn": 4200000000, "addressFamily": "ipv6"}]},
        "trafficEncryptionMode": "wireguard", "wireguard": {"startUserspace": False, "port": 51821},
        "networkPolicyDeniedLog": {"enabled": True, "rate": 5, "burst": 50},
    }}
    # a values file and --set together, as a user mixes them; --set's numbers are integers too
    docs = render(helm_home, "--set", "config.transportVLAN=100,config.ovsDaemons=host,config.resyncSeconds=30",
                  "--set", "config.wireguard.persistentKeepalive=25", values=values)
    (tmp_path / "chart.yaml").write_text(config_map_text(docs))
    (tmp_path / "hand.yaml").write_text(HAND_WRITTEN)
    from_chart = rs_config.load(str(tmp_path / "chart.yaml"))
    assert from_chart == rs_config.load(str(tmp_path / "hand.yaml"))
    assert from_chart.bgp is not None and from_chart.bgp.peers[1].asn == 4200000000  # not 4.2e+09
    assert from_chart != rs_config.Config(node_name=from_chart.node_name)  # not two defaults compared


def test_null_removes_a_default_key(helm_home: Path) -> None:
    conf = yaml.safe_load(config_map_text(render(helm_home, "--set", "config.serviceCIDRs=null")))
    assert "serviceCIDRs" not in conf and conf["trafficEncapMode"] == "encap"


@pytest.mark.parametrize(("setting", "field"), [
    ("config.trafficEncapMode=tunnel", "trafficEncapMode"),
    ("config.tunnelType=ipip", "tunnelType"),
    ("config.datapathType=dpdk", "datapathType"),
    ("config.ovsDaemons=container", "ovsDaemons"),
    ("config.policyPeers=slices", "policyPeers"),
    ("config.trafficEncryptionMode=ipsec", "trafficEncryptionMode"),
    ("config.transportVLAN=4095", "transportVLAN"),
    ("config.noSNAT=maybe", "noSNAT"),
    ("config.trafficEncapMod=noEncap", "trafficEncapMod"),  # a misspelt key, not silently ignored
    ("config.bgp.localASN=64512", "peers"),  # bgp without peers
    ("config.wireguard.implementation=ebpf", "implementation"),
    ("image.pullPolicy=Sometimes", "pullPolicy"),
])
def test_a_bad_value_is_refused_naming_the_field(helm_home: Path, setting: str, field: str) -> None:
    cp = helm(helm_home, "template", manifests.RELEASE, str(CHART), "--namespace", manifests.NAMESPACE,
              "--set", setting)
    assert cp.returncode != 0 and "schema" in cp.stderr, cp.stderr
    assert field in cp.stderr, cp.stderr


def schema_config() -> dict[str, Any]:
    return dict(json.loads((CHART / "values.schema.json").read_text())["properties"]["config"])


def test_the_schema_names_route_syncs_keys_and_words() -> None:
    conf = schema_config()
    props = conf["properties"]
    assert conf["additionalProperties"] is False
    assert set(props) == rs_config.KEYS
    assert set(props["bgp"]["properties"]) == rs_config.BGP_KEYS
    assert set(props["bgp"]["properties"]["peers"]["items"]["properties"]) == rs_config.PEER_KEYS
    assert set(props["wireguard"]["properties"]) == rs_config.WG_KEYS
    assert set(props[rs_config.DENIED_LOG_SECTION]["properties"]) == rs_config.DENIED_LOG_KEYS
    assert set(props["nodeSource"]["properties"]) == rs_config.NODE_SOURCE_KEYS
    words = {"trafficEncapMode": modes.MODES, "tunnelType": modes.TUNNEL_TYPES, "datapathType": modes.DATAPATHS,
             "ovsDaemons": rs_config.OVS_DAEMONS, "trafficEncryptionMode": modes.ENCRYPTIONS,
             "macSource": rs_config.MAC_SOURCES, "policyPeers": rs_config.POLICY_PEERS}
    for key, choices in words.items():
        assert sorted(props[key]["enum"]) == sorted(choices), key
    assert sorted(props["nodeSource"]["properties"]["type"]["enum"]) == sorted(rs_config.SOURCE_TYPES)
    assert sorted(props["wireguard"]["properties"]["implementation"]["enum"]) == sorted(rs_config.WG_IMPLEMENTATIONS)


def test_the_labs_overlay_as_values_renders_the_overlay_applied(helm_home: Path) -> None:
    """ferry-lab's installer helm installs what its installer kubectl applies."""
    for overlay in (manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16", "fd00:10:244::/56"),
                                      {"trafficEncapMode": "hybrid", "tunnelType": "geneve", "ovsDaemons": "host"},
                                      "ferry-cni/ferry:rolled"),
                    manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16",), {"trafficEncapMode": "encap"},
                                      api_override=False),
                    manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16",),
                                      {"trafficEncapMode": "encap", "policyPeers": "peerSlices"},
                                      "ferry-cni/ferry:rolled"),
                    manifests.Overlay("192.168.99.2", 6443, ("10.244.0.0/16",),
                                      {"trafficEncapMode": "encap", "policyPeers": "peerSlices"},
                                      controller_delivery="subscription")):
        rendered = by_object(render(helm_home, values=manifests.helm_values(overlay)))
        applied = manifests.apply_overlay(manifests.load(str(MANIFEST)), overlay)
        if manifests.wants_controller(overlay):  # and ferry-controller, with the same image and API override
            applied += manifests.controller_docs(overlay, str(CONTROLLER_MANIFEST))
        assert rendered == by_object(applied)


def test_every_optional_part_renders_valid_objects(helm_home: Path) -> None:
    """The values the defaults leave empty (pullPolicy, nodeSelector, install-cni's resources,
    extraEnv, no tolerations) render objects Kubernetes' schemas accept, strictly, where they belong."""
    values = {"image": {"repository": "registry.example/ferry", "tag": "9.9.9", "pullPolicy": "Always"},
              "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [], "maxUnavailable": "20%",
              "resources": {"installCni": {"limits": {"memory": "256Mi"}}},
              "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": "192.0.2.10"}]}
    docs = render(helm_home, values=values)
    for d in docs:
        assert kv.validate(d, kv.latest_version(), strict=True), d["kind"]
    for ds in manifests.daemonsets(docs):
        pod = ds["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"} and "tolerations" not in pod
        for c in (*pod.get("initContainers", []), *pod["containers"]):
            assert (c["image"], c["imagePullPolicy"]) == ("registry.example/ferry:9.9.9", "Always")
            assert [e["name"] for e in c.get("env", [])] == (
                [] if c["name"] == "wait-openvswitch" else ["NODE_NAME", "KUBERNETES_SERVICE_HOST"])
    pod = manifests.daemonset(docs)["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["resources"] == {"limits": {"memory": "256Mi"}}
    assert manifests.daemonset(docs)["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "20%"}
    assert manifests.daemonset(docs, manifests.OVS_DAEMONSET)["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_open_vswitch_may_roll_with_route_sync(helm_home: Path) -> None:
    """openvswitch.updateStrategy RollingUpdate: each upgrade restarts the Nodes' switches too,
    as many at once as route-sync's; a strategy the chart does not know is refused, naming it."""
    docs = render(helm_home, values={"openvswitch": {"updateStrategy": "RollingUpdate"}, "maxUnavailable": 2})
    for d in docs:
        assert kv.validate(d, kv.latest_version(), strict=True), d["kind"]
    assert manifests.daemonset(docs, manifests.OVS_DAEMONSET)["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 2}}
    cp = helm(helm_home, "template", "ferry", str(CHART), "--set", "openvswitch.updateStrategy=Recreate")
    assert cp.returncode != 0 and "updateStrategy" in cp.stderr, cp.stderr


def test_the_suites_helm_is_the_pinned_one(helm_home: Path) -> None:
    pinned = re.search(r"^require helm\.sh/helm/v4 (v\S+)$", (ROOT / "tools" / "helm" / "go.mod").read_text(),
                       re.MULTILINE)
    assert pinned
    cp = helm(helm_home, "version", "--template", "{{.Version}}")
    assert (cp.returncode, cp.stdout.strip()) == (0, pinned.group(1)), cp.stderr


def test_helm_lint_passes(helm_home: Path) -> None:
    cp = helm(helm_home, "lint", "--strict", str(CHART), "--namespace", manifests.NAMESPACE)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert "0 chart(s) failed" in cp.stdout
