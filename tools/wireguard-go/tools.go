//go:build tools

// Package tools pins wireguard-go, the userspace WireGuard: `go build golang.zx2c4.com/wireguard`
// in this directory builds the version go.mod names, verified against go.sum.
package tools

import _ "golang.zx2c4.com/wireguard"
