#!/usr/bin/env bash
# Builds the Go programs Ferry's tests, lab and benchmarks run, from the pinned modules under tools/
# (cnitool; wireguard-go, the userspace WireGuard; etcd and the Kubernetes components; the
# ClusterNetworkPolicy conformance suite; Helm; the benchmarks'
# peers: ovs-cni's plugin and upstream's bridge + host-local), into a cache that outlives the clone, keyed by go.mod, go.sum and the Go
# version. Idempotent: a cached build is linked, not rebuilt. A name with a slash is linked in a
# directory of build/tools (a CNI_PATH: build/tools/cni-plugins/{bridge,host-local}).
#   tools/build-go-tools.sh cnitool|wireguard-go|kubernetes|kube-e2e|kube-e2e-images|coredns|network-policy-api|helm|ovs-cni|cni-plugins ...
# Every module is verified against the committed go.sum (-mod=readonly); nothing is fetched but
# modules through the Go module proxy.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cache=${FERRY_TOOLS_CACHE:-/var/cache/ferry/go-tools}
out=$here/build/tools
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=${CGO_ENABLED:-1}
command -v go >/dev/null || { echo "build-go-tools: no 'go' on PATH (Go 1.24 or later is needed)" >&2; exit 1; }

packages_of() {
  case $1 in
    cnitool) echo "cnitool=github.com/containernetworking/cni/cnitool" ;;
    # route-sync starts it where the kernel has no WireGuard (routesync/wireguard); static: it also
    # runs in Ferry's image (tools/build-image.sh copies it in), whose C library need not match.
    wireguard-go) echo "wireguard-go=static:golang.zx2c4.com/wireguard" ;;
    kubernetes) echo "etcd=./cmd/etcd kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl" \
                     "kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager" \
                     "kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubelet=k8s.io/kubernetes/cmd/kubelet" \
                     "kube-proxy=k8s.io/kubernetes/cmd/kube-proxy" ;;
    # Kubernetes' own e2e tests (a test binary: go test -c), the agnhost image's binary, and the
    # ginkgo CLI at the version e2e.test links; from the same module as the components.
    # A package marked static: is built without cgo: it runs inside the lab's images (CoreDNS;
    # agnhost, which e2e's Pods run), which carry no C library.
    kube-e2e) echo "e2e.test=test:k8s.io/kubernetes/test/e2e agnhost=static:k8s.io/kubernetes/test/images/agnhost" \
                   "ginkgo=github.com/onsi/ginkgo/v2/ginkgo" ;;
    # What the e2e images carry besides agnhost (lab/kube/e2eimages.py): nonewprivs' nnp, which
    # prints its effective uid (the image sets it setuid root), and the Aggregator spec's extension
    # API server (k8s.io/sample-apiserver at the lab's version, the module e2e.test itself links);
    # static, as agnhost.
    kube-e2e-images) echo "nnp=static:k8s.io/kubernetes/test/images/nonewprivs" \
                          "sample-apiserver=static:k8s.io/sample-apiserver" ;;
    coredns) echo "coredns=static:github.com/coredns/coredns" ;;
    # The ClusterNetworkPolicy conformance suite (a test binary, its base manifests embedded):
    # `make conformance CONFORMANCE="--suite cnp"` (lab/conformance/cnp.py).
    network-policy-api) echo "cnp-conformance.test=test:sigs.k8s.io/network-policy-api/conformance" ;;
    # Helm, which renders, lints and installs deploy/helm/ferry (tests/ship/test_helm_chart.py,
    # ferry-lab's installer: helm); static, a client that runs anywhere.
    helm) echo "helm=static:helm.sh/helm/v4/cmd/helm" ;;
    ovs-cni) echo "ovs-cni/ovs=github.com/k8snetworkplumbingwg/ovs-cni/cmd/plugin" ;;
    cni-plugins) echo "cni-plugins/bridge=github.com/containernetworking/plugins/plugins/main/bridge" \
                      "cni-plugins/host-local=github.com/containernetworking/plugins/plugins/ipam/host-local" ;;
    *) echo "build-go-tools: unknown tool set '$1' (cnitool, wireguard-go, kubernetes, kube-e2e, kube-e2e-images, coredns, network-policy-api, helm, ovs-cni, cni-plugins)" >&2; return 1 ;;
  esac
}

# Version stamps Kubernetes' own build (hack/lib/version.sh) sets, so `kubectl version` and the
# Node objects report v1.x.y instead of v0.0.0-master.
ldflags_of() {
  local v
  case $1 in
    kubernetes|kube-e2e)
      v=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$here/tools/kubernetes/go.mod" | head -1)
      local minor=${v#v1.}; minor=${minor%%.*}
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf ' -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean' \
          "$pkg" "$v" "$pkg" "$pkg" "$minor" "$pkg"
      done ;;
    helm)  # what Helm's own Makefile stamps: `helm version` says v4.x.y, not the source's v4.x
      v=$(sed -n 's/^require helm.sh\/helm\/v4 \(v[0-9.]*\)$/\1/p' "$here/tools/helm/go.mod")
      printf ' -X helm.sh/helm/v4/internal/version.version=%s -X helm.sh/helm/v4/internal/version.gitTreeState=clean' "$v" ;;
    cni-plugins)  # what upstream's release build stamps: `bridge` prints "CNI bridge plugin v1.x.y"
      v=$(sed -n 's/^require github.com\/containernetworking\/plugins \(v[0-9.]*\)$/\1/p' "$here/tools/cni-plugins/go.mod")
      printf ' -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=%s' "$v" ;;
  esac
}

build_set() {
  local set=$1 mod=$here/tools/$1 key dest tmp spec name pkg t0 t1 cgo
  case $set in kube-e2e|kube-e2e-images) mod=$here/tools/kubernetes ;; esac
  key=$( (cat "$mod/go.mod" "$mod/go.sum" "$mod"/cmd/*/*.go 2>/dev/null; go version; ldflags_of "$set"; packages_of "$set") \
        | sha256sum | cut -c1-16)
  dest=$cache/$set-$key
  if [ -f "$dest/.complete" ]; then
    echo "build-go-tools: $set: cached ($dest)" >&2
  else
    tmp=$(mktemp -d "$cache/.$set-XXXXXX")
    t0=$(date +%s)
    # The modules first, as a step of its own (Kubernetes': ~1 GB): a first build would otherwise
    # fetch them silently inside its first component's build.
    echo "build-go-tools: $set: downloading its modules (go.sum-verified, through the Go module proxy)" >&2
    (cd "$mod" && go mod download)
    echo "build-go-tools: $set: modules in $(( $(date +%s) - t0 )) s" >&2
    for spec in $(packages_of "$set"); do
      name=${spec%%=*}; pkg=${spec#*=}; cgo=$CGO_ENABLED
      case $pkg in static:*) pkg=${pkg#static:}; cgo=0 ;; esac
      echo "build-go-tools: $set: building $name (${pkg#test:}) ..." >&2
      mkdir -p "$(dirname "$tmp/$name")"
      t1=$(date +%s)
      case $pkg in
        test:*) (cd "$mod" && CGO_ENABLED=$cgo go test -c -ldflags="-s -w$(ldflags_of "$set")" -o "$tmp/$name" "${pkg#test:}") ;;
        *) (cd "$mod" && CGO_ENABLED=$cgo go build -ldflags="-s -w$(ldflags_of "$set")" -o "$tmp/$name" "$pkg") ;;
      esac
      echo "build-go-tools: $set: $name built in $(( $(date +%s) - t1 )) s" >&2
    done
    echo "build-go-tools: $set built in $(( $(date +%s) - t0 )) s" >&2
    touch "$tmp/.complete"
    rm -rf "$dest"; mv "$tmp" "$dest"
  fi
  mkdir -p "$out"
  for spec in $(packages_of "$set"); do
    name=${spec%%=*}
    mkdir -p "$(dirname "$out/$name")"
    ln -sfn "$dest/$name" "$out/$name"
  done
}

mkdir -p "$cache"
for set in "${@:-cnitool}"; do build_set "$set"; done
