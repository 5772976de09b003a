"""The ClusterNetworkPolicy CRD deploy/ ships: byte for byte the network-policy-api module's at
the version its own annotation names (tools/sync-cnp-crd.sh copies it), and the API route-sync
watches (routesync/policy/cnp/model.py) is one it serves; the Helm chart's crds/ holds the same files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml

from routesync.policy.cnp.model import GROUP, PLURAL, VERSION

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CRD = DEPLOY / "crds" / "policy.networking.k8s.io_clusternetworkpolicies.yaml"
CHART_CRDS = DEPLOY / "helm" / "ferry" / "crds"  # what `helm install` creates before the chart's objects


def test_the_charts_crds_are_deploy_crds_byte_for_byte() -> None:
    shipped = {p.name: p.read_bytes() for p in CRD.parent.iterdir()}
    assert {p.name: p.read_bytes() for p in CHART_CRDS.iterdir()} == shipped


def test_the_crd_is_the_modules_at_its_version_and_serves_what_route_sync_watches() -> None:
    doc = yaml.safe_load(CRD.read_text())
    ann = doc["metadata"]["annotations"]
    version, channel = ann["policy.networking.k8s.io/bundle-version"], ann["policy.networking.k8s.io/channel"]
    assert channel == "experimental"  # Ferry reads the experimental peers (nodes, domainNames)
    assert (doc["spec"]["group"], doc["spec"]["names"]["plural"]) == (GROUP, PLURAL)
    served = {v["name"]: v["served"] for v in doc["spec"]["versions"]}
    assert served.get(VERSION) is True
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    out = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/network-policy-api@{version}"],
                         capture_output=True, text=True, check=True, env=env, cwd="/", timeout=600)
    module = Path(json.loads(out.stdout)["Dir"])
    assert (module / "config" / "crd" / channel / CRD.name).read_bytes() == CRD.read_bytes()
