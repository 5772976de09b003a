//go:build tools

// Package tools pins ovs-cni's plugin: `go build github.com/k8snetworkplumbingwg/ovs-cni/cmd/plugin`
// in this directory builds the version go.mod names, verified against go.sum.
package tools

import _ "github.com/k8snetworkplumbingwg/ovs-cni/cmd/plugin"
