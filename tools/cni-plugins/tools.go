//go:build tools

// Package tools pins upstream's reference plugins: `go build .../plugins/main/bridge` and
// `.../plugins/ipam/host-local` in this directory build the version go.mod names, verified
// against go.sum.
package tools

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
)
