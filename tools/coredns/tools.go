//go:build tools

// Package tools pins CoreDNS (built with `go build github.com/coredns/coredns`).
package tools

import _ "github.com/coredns/coredns"
