#!/usr/bin/env bash
# deploy/crds/ and the Helm chart's crds/ (which Helm installs first): the ClusterNetworkPolicy CRD
# of sigs.k8s.io/network-policy-api at the version Ferry implements, copied byte for byte from the
# module (its experimental channel: the standard fields and the `nodes`/`domainNames` peers Ferry
# reads). tests/ship/test_cnp_crd.py holds all three equal.
#   tools/sync-cnp-crd.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-v0.3.0}"
dir="$(GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/network-policy-api@$version" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
for to in deploy/crds/ deploy/helm/ferry/crds/; do
  install -m 0644 "$dir/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml" "$to"
done
echo "deploy/crds/, deploy/helm/ferry/crds/: network-policy-api $version"
