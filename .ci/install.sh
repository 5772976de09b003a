#!/usr/bin/env bash
# Installs everything Ferry's tests, lab and benchmarks need on Debian 12, as root. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
shared=${FERRY_SHARED:-$here/../shared}
export DEBIAN_FRONTEND=noninteractive

apt_pkgs=(openvswitch-switch openvswitch-common iproute2 nftables iptables ethtool iperf3 tcpdump
          iputils-ping arping containernetworking-plugins procps psmisc kmod conntrack python3-venv)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cnitool, built from Debian's packaged source (skips when present).
if ! [ -x /opt/cni-tools/cnitool ]; then
  sh "$shared/tools/build-cnitool.sh"
fi

# The project's virtualenv: runtime + dev dependencies, Ferry installed editable.
venv=${FERRY_VENV:-$here/.venv}
if ! [ -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.ferry-deps-$(sha1sum "$here/pyproject.toml" | cut -c1-12)"
if ! [ -f "$stamp" ]; then
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q -e "$here[dev]"
  touch "$stamp"
fi
echo "install: ok (venv $venv)"
