#!/usr/bin/env bash
# Installs everything Ferry's tests, lab and benchmarks need on Debian 12, as root. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export DEBIAN_FRONTEND=noninteractive

apt_pkgs=(openvswitch-switch openvswitch-common iproute2 nftables iptables ethtool iperf3 tcpdump
          iputils-ping arping containernetworking-plugins procps psmisc kmod conntrack python3-venv
          containerd runc podman mmdebstrap util-linux busybox-static graphviz frr libpython3.11)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  # frr: the lab's router runs bgpd/zebra itself, in its namespace; the package's own service
  # (all daemons in the host's namespace) must not start, so invoke-rc.d is told no meanwhile.
  guard=""
  if ! [ -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && guard=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  [ -z "$guard" ] || rm -f /usr/sbin/policy-rc.d
fi

# Go programs from their pinned modules (cnitool; the benchmarks' peers ovs-cni and upstream's
# bridge + host-local, ~40 s cold, unless FERRY_BENCH_PEERS=0; with FERRY_KUBERNETES=1 also etcd
# and the Kubernetes components), cached outside the clone: tools/build-go-tools.sh.
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
go_sets=(cnitool)
[ "${FERRY_BENCH_PEERS:-1}" = 0 ] || go_sets+=(ovs-cni cni-plugins)
# The Kubernetes lab's Services and `make conformance`: CoreDNS, e2e.test + agnhost + ginkgo.
[ "${FERRY_KUBERNETES:-1}" = 0 ] || go_sets+=(kubernetes kube-e2e coredns)
bash "$here/tools/build-go-tools.sh" "${go_sets[@]}"

# The project's virtualenv: runtime + dev + bench-only dependencies, Ferry installed editable.
venv=${FERRY_VENV:-$here/.venv}
if ! [ -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.ferry-deps-$(sha1sum "$here/pyproject.toml" | cut -c1-12)"
if ! [ -f "$stamp" ]; then
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -e "$here[dev,bench]"
  # bench_osken's os-ken, without its controller framework's dependencies (pyproject.toml: bench)
  "$venv/bin/pip" install -q --no-deps "os-ken==4.2.2"
  touch "$stamp"
fi
# The frozen bundle's virtualenv (`make dist`): the distribution's own CPython, an optimised
# (PGO + LTO) build whose libpython3.11 the bundle carries; a pyenv or self-built Python is
# neither, and every per-Pod exec pays for it (bench_cni: frozen vs launcher). Runtime
# dependencies (ferry-route-sync is in the bundle too) + PyInstaller.
dist_venv=${FERRY_DIST_VENV:-$here/.venv-dist}
dist_python=${FERRY_DIST_PYTHON:-/usr/bin/python3}
if ! [ -x "$dist_venv/bin/python" ]; then
  "$dist_python" -m venv "$dist_venv"
fi
dist_stamp="$dist_venv/.ferry-deps-$(sha1sum "$here/pyproject.toml" | cut -c1-12)"
if ! [ -f "$dist_stamp" ]; then
  "$dist_venv/bin/pip" install -q --upgrade pip
  "$dist_venv/bin/pip" install -q -e "$here[dist]"
  touch "$dist_stamp"
fi
echo "install: ok (venv $venv, bundle venv $dist_venv)"
