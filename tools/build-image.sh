#!/usr/bin/env bash
# `make image`: Ferry's container image from the frozen bundle, with nothing pulled from a registry.
#   tools/build-image.sh [TAG]        (default: the tag deploy/ferry.yaml names)
# 1. base root file system: mmdebstrap of Debian 12 with the packages the Containerfile names,
#    cached outside the clone by the package list (a fresh machine builds it once, ~30 s);
# 2. the frozen bundle (`make dist` must have run: dist/ferry) and wireguard-go, the userspace
#    WireGuard (tools/build-go-tools.sh wireguard-go: static, linked from its cache when built);
# 3. podman build -f Containerfile, then an OCI archive at build/image/ferry-<TAG>.tar that
#    `ctr images import` loads (the lab loads it into every Node's containerd).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
image=$(sed -n 's/^ *image: *\(ferry-cni\/ferry\):\(.*\)$/\1/p' "$here/deploy/ferry.yaml" | head -1)
tag=${1:-$(sed -n 's/^ *image: *ferry-cni\/ferry:\(.*\)$/\1/p' "$here/deploy/ferry.yaml" | head -1)}
ref=docker.io/$image:$tag
packages=openvswitch-switch,libnftables1,iproute2,wireguard-tools
cache=${FERRY_IMAGE_CACHE:-/var/cache/ferry/image}
out=$here/build/image
mkdir -p "$cache" "$out"
[ -x "$here/dist/ferry/ferry-route-sync" ] || { echo "build-image: no dist/ferry (run make dist)" >&2; exit 1; }
command -v go >/dev/null || export PATH=$PATH:/usr/local/go/bin
bash "$here/tools/build-go-tools.sh" wireguard-go
wireguard_go=$here/build/tools/wireguard-go
[ -x "$wireguard_go" ] || { echo "build-image: no $wireguard_go (tools/build-go-tools.sh wireguard-go)" >&2; exit 1; }

t0=$(date +%s)
since() { echo "$(( $(date +%s) - $1 )) s"; }
key=$(echo "bookworm essential $packages" | sha256sum | cut -c1-12)
base=$cache/rootfs-$key.tar
if ! [ -f "$base" ]; then
  echo "build-image: making the base root file system (mmdebstrap bookworm + $packages) ..." >&2
  t1=$(date +%s)
  mmdebstrap --quiet --variant=essential --include="$packages" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' bookworm "$cache/.partial-$key.tar"
  mv "$cache/.partial-$key.tar" "$base"
  echo "build-image: base root file system in $(since "$t1")" >&2
else
  echo "build-image: base root file system cached ($base)" >&2
fi
ctx=$out/context
rm -rf "$ctx"; mkdir -p "$ctx"
ln "$base" "$ctx/rootfs.tar" 2>/dev/null || cp "$base" "$ctx/rootfs.tar"
cp -a "$here/dist/ferry" "$ctx/ferry"
cp -L "$wireguard_go" "$ctx/wireguard-go"  # build/tools links into the Go tools' cache
echo "build-image: podman build $ref, then its OCI archive ..." >&2
t1=$(date +%s)
podman build --quiet -f "$here/Containerfile" -t "$ref" "$ctx" >/dev/null
rm -f "$out/ferry-$tag.tar"
podman save --quiet --format oci-archive -o "$out/ferry-$tag.tar" "$ref"
rm -rf "$ctx"
echo "build-image: image in $(since "$t1") (all of build-image: $(since "$t0"))" >&2
echo "$out/ferry-$tag.tar"
