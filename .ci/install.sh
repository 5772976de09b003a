#!/usr/bin/env bash
# Installs everything Ferry's tests, lab and benchmarks need on Debian 12, as root. Idempotent.
# Each step prints what it does and, when it is done, how long it took.
#
# By default everything (`make test`, `make bench`, `make demo-k8s`, `make dist`/`image`). Switches,
# each 1 (the default) or 0; `make demo` sets all four to 0 (the embedded-registry demo runs none of it):
#   FERRY_KUBERNETES   etcd, the Kubernetes components, e2e.test/agnhost/ginkgo, CoreDNS, Helm (Go, ~5 min
#                      cold), the Nodes' container runtime (containerd, runc, busybox-static) and the
#                      e2e busybox images' busybox, built from its source (tools/build-busybox.sh, ~2 min cold)
#   FERRY_BENCH_PEERS  the benchmarks' Go peers: ovs-cni, upstream's bridge + host-local (~40 s cold)
#   FERRY_DEV          the venv's dev + bench extras (pytest, mypy, ruff, pyroute2, os-ken, ...), iperf3, tcpdump
#   FERRY_DIST         the frozen bundle's venv (PyInstaller on the distribution's Python), libpython3.11,
#                      and what `make image` builds with (podman, mmdebstrap)
# Paths: FERRY_VENV (.venv), FERRY_DIST_VENV (.venv-dist), FERRY_DIST_PYTHON (/usr/bin/python3), and
# tools/build-go-tools.sh's FERRY_TOOLS_CACHE (/var/cache/ferry/go-tools).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive
kubernetes=${FERRY_KUBERNETES:-1} bench_peers=${FERRY_BENCH_PEERS:-1} dev=${FERRY_DEV:-1} dist=${FERRY_DIST:-1}

t_all=$(date +%s)
step_t0=0 step_name=""
step() { step_name=$1; step_t0=$(date +%s); echo "install: $step_name: $2 ..." >&2; }
step_done() { echo "install: $step_name: ${1:-done} in $(( $(date +%s) - step_t0 )) s" >&2; }
# A command's output goes to a log that is shown only when it fails (pip's build backend warns at
# length about things that are not this install's business).
quiet() {
  local log rc=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { cat "$log" >&2; echo "install: failed ($rc): $*" >&2; }
  rm -f "$log"
  return "$rc"
}

# What the embedded-registry lab runs (make demo): OVS, the kernel's networking tools, Debian's
# reference plugins (chaining), Graphviz for the picture, FRR for a topology's BGP router,
# wireguard-tools (`wg`: the kernel's WireGuard, and a look at wireguard-go's devices).
apt_pkgs=(openvswitch-switch openvswitch-common iproute2 nftables iptables ethtool iputils-ping arping
          containernetworking-plugins procps psmisc kmod conntrack python3-venv util-linux graphviz frr
          wireguard-tools)
[ "$dev" = 0 ] || apt_pkgs+=(iperf3 tcpdump)
[ "$kubernetes" = 0 ] || apt_pkgs+=(containerd runc busybox-static gcc make libc6-dev bzip2 curl)
[ "$dist" = 0 ] || apt_pkgs+=(libpython3.11 podman mmdebstrap)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step apt "installing ${#missing[@]} Debian packages (${missing[*]})"
  apt-get update -qq
  # frr: the lab's router runs bgpd/zebra itself, in its namespace; the package's own service
  # (all daemons in the host's namespace) must not start, so invoke-rc.d is told no meanwhile.
  guard=""
  if ! [ -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d
  step_done "${#missing[@]} packages"
else
  echo "install: apt: the ${#apt_pkgs[@]} Debian packages are installed" >&2
fi

# Go programs from their pinned modules, cached outside the clone: tools/build-go-tools.sh (it
# prints each module download and each component it builds, with its time).
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
# cnitool and wireguard-go (the userspace WireGuard: the lab's --encryption wireguard, make demo's too)
go_sets=(cnitool wireguard-go)
[ "$bench_peers" = 0 ] || go_sets+=(ovs-cni cni-plugins)
# The Kubernetes lab's Services and `make conformance`: CoreDNS, e2e.test + agnhost + ginkgo, what the
# e2e images carry besides (nonewprivs' nnp, sample-apiserver), the ClusterNetworkPolicy
# conformance suite (network-policy-api: ~3 min to build once, then cached); Helm
# (deploy/helm/ferry: tests/ship/test_helm_chart.py, the lab's `installer: helm`).
[ "$kubernetes" = 0 ] || go_sets+=(kubernetes kube-e2e kube-e2e-images coredns network-policy-api helm)
step go "${go_sets[*]}"
bash "$here/tools/build-go-tools.sh" "${go_sets[@]}"
step_done
if [ "$kubernetes" != 0 ]; then
  step busybox "the e2e busybox images' busybox 1.37.0 from its source (tools/build-busybox.sh)"
  bash "$here/tools/build-busybox.sh"
  step_done
fi

# The project's virtualenv: runtime dependencies, Ferry installed editable; unless FERRY_DEV=0
# also the dev and bench-only ones. A stamp per pyproject.toml and extras: a full install also
# satisfies a runtime-only one, not the other way round.
venv=${FERRY_VENV:-$here/.venv}
deps=$(sha1sum "$here/pyproject.toml" | cut -c1-12)
stamp_full="$venv/.ferry-deps-$deps" stamp_runtime="$venv/.ferry-deps-$deps-runtime"
if [ -f "$stamp_full" ] || { [ "$dev" = 0 ] && [ -f "$stamp_runtime" ]; }; then
  echo "install: venv: $venv is up to date" >&2
else
  step venv "$venv: pip install ferry-cni$([ "$dev" = 0 ] || echo '[dev,bench]') (PyPI)"
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  quiet "$venv/bin/pip" install -q --upgrade pip
  if [ "$dev" = 0 ]; then
    quiet "$venv/bin/pip" install -q -e "$here"
    touch "$stamp_runtime"
  else
    quiet "$venv/bin/pip" install -q -e "$here[dev,bench]"
    # bench_osken's os-ken, without its controller framework's dependencies (pyproject.toml: bench)
    quiet "$venv/bin/pip" install -q --no-deps "os-ken==4.2.2"
    touch "$stamp_full"
  fi
  step_done
fi

# The frozen bundle's virtualenv (`make dist`): the distribution's own CPython, an optimised
# (PGO + LTO) build whose libpython3.11 the bundle carries; a pyenv or self-built Python is
# neither, and every per-Pod exec pays for it (bench_cni: frozen vs launcher). Runtime
# dependencies (ferry-route-sync is in the bundle too) + PyInstaller.
dist_venv=${FERRY_DIST_VENV:-$here/.venv-dist}
if [ "$dist" = 0 ]; then
  dist_venv="none (FERRY_DIST=0)"
else
  dist_python=${FERRY_DIST_PYTHON:-/usr/bin/python3}
  dist_stamp="$dist_venv/.ferry-deps-$deps"
  if [ -f "$dist_stamp" ]; then
    echo "install: bundle venv: $dist_venv is up to date" >&2
  else
    step "bundle venv" "$dist_venv: pip install ferry-cni[dist] on $dist_python (PyPI)"
    [ -x "$dist_venv/bin/python" ] || "$dist_python" -m venv "$dist_venv"
    quiet "$dist_venv/bin/pip" install -q --upgrade pip
    quiet "$dist_venv/bin/pip" install -q -e "$here[dist]"
    touch "$dist_stamp"
    step_done
  fi
fi
echo "install: ok in $(( $(date +%s) - t_all )) s (venv $venv, bundle venv $dist_venv)"
