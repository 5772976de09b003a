//go:build tools

// Package tools pins Helm's module: `go build helm.sh/helm/v4/cmd/helm` in this directory builds
// the version go.mod names, verified against go.sum.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
