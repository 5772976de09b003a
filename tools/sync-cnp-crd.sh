#!/usr/bin/env bash
# deploy/crds/: the ClusterNetworkPolicy CRD of sigs.k8s.io/network-policy-api at the version Ferry
# implements, copied byte for byte from the module (its experimental channel: the standard fields
# and the `nodes`/`domainNames` peers Ferry reads). tests/ship/test_cnp_crd.py holds them equal.
#   tools/sync-cnp-crd.sh [VERSION]
set -euo pipefail
cd "$(dirname "$0")/.."
version="${1:-v0.3.0}"
dir="$(GOFLAGS=-mod=mod GOTOOLCHAIN=local go mod download -json "sigs.k8s.io/network-policy-api@$version" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
install -m 0644 "$dir/config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml" deploy/crds/
echo "deploy/crds/: network-policy-api $version"
