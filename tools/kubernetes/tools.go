//go:build tools

// Package tools pins the Kubernetes components ferry-lab runs (built with `go build PKG`), and what
// `make conformance` runs: Kubernetes' own e2e tests (`go test -c k8s.io/kubernetes/test/e2e`), the
// agnhost image's binary, the ginkgo CLI that runs e2e.test in parallel processes, and the
// Aggregator spec's extension API server, k8s.io/sample-apiserver (a module of its own: e2e.test links
// only its API types, so go.mod requires it directly for `go build k8s.io/sample-apiserver`).
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/sample-apiserver"
)
