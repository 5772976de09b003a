//go:build tools

// Package tools pins cnitool's module: `go build github.com/containernetworking/cni/cnitool`
// in this directory builds the version go.mod names, verified against go.sum.
package tools

import _ "github.com/containernetworking/cni/cnitool"
