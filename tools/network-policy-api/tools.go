//go:build tools

// Package tools pins what `make conformance CONFORMANCE="--suite cnp"` runs: the ClusterNetworkPolicy
// conformance suite of sigs.k8s.io/network-policy-api (its test binary: `go test -c
// sigs.k8s.io/network-policy-api/conformance`, whose base manifests are embedded in it).
package tools

import (
	_ "sigs.k8s.io/network-policy-api/conformance"
	_ "sigs.k8s.io/network-policy-api/conformance/tests"
)
