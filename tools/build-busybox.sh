#!/usr/bin/env bash
# Builds the busybox that Kubernetes' e2e busybox images carry (lab/kube/e2eimages.py) from a pinned
# source, as upstream's image is built: e2e's test/images/busybox (1.37.0-2) is FROM Docker's
# busybox:1.37.0, busybox's own `make defconfig` linked statically against glibc, with `sh` being
# busybox's ash. Debian's busybox-static is another configuration (its ash drops environment
# variables whose names are no shell names, such as ConfigMap keys like data-1, which e2e's envFrom
# specs look for); this one passes them on, as upstream's does.
#
# Source: Debian's orig tarball of busybox 1.37.0 (trixie's source package; busybox.net is not
# reachable here), verified against its sha256. Cached outside the clone, keyed by this script and
# the compiler, and linked as build/tools/busybox. Idempotent.
#   tools/build-busybox.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
version=1.37.0
url=http://deb.debian.org/debian/pool/main/b/busybox/busybox_${version}.orig.tar.bz2
sha256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
cache=${FERRY_BUSYBOX_CACHE:-/var/cache/ferry/busybox}
out=$here/build/tools

for cmd in gcc make bzip2 curl; do
  command -v "$cmd" >/dev/null || { echo "build-busybox: no '$cmd' on PATH (apt-get install gcc make bzip2 curl libc6-dev)" >&2; exit 1; }
done
key=$( (cat "$0"; gcc --version | head -1) | sha256sum | cut -c1-16)
dest=$cache/busybox-$version-$key
if [ -f "$dest/.complete" ]; then
  echo "build-busybox: cached ($dest)" >&2
else
  mkdir -p "$cache"
  tarball=$cache/busybox_${version}.orig.tar.bz2
  if ! echo "$sha256  $tarball" | sha256sum -c --status 2>/dev/null; then
    echo "build-busybox: fetching $url" >&2
    curl -fsSL --retry 3 -o "$tarball.partial" "$url"
    echo "$sha256  $tarball.partial" | sha256sum -c --status \
      || { echo "build-busybox: $url does not match sha256 $sha256" >&2; rm -f "$tarball.partial"; exit 1; }
    mv "$tarball.partial" "$tarball"
  fi
  tmp=$(mktemp -d "$cache/.busybox-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  t0=$(date +%s)
  tar -xjf "$tarball" -C "$tmp"
  src=$tmp/busybox-$version
  make -C "$src" -s defconfig >/dev/null
  # Static, as Docker's image; glibc no longer has Sun RPC (inetd's RPC services are the only users).
  sed -i -e 's/^# CONFIG_STATIC is not set$/CONFIG_STATIC=y/' \
         -e 's/^CONFIG_FEATURE_HAVE_RPC=y$/# CONFIG_FEATURE_HAVE_RPC is not set/' \
         -e 's/^CONFIG_FEATURE_INETD_RPC=y$/# CONFIG_FEATURE_INETD_RPC is not set/' "$src/.config"
  { yes "" || true; } | make -C "$src" -s oldconfig >/dev/null  # (yes ends on SIGPIPE)
  grep -qx 'CONFIG_STATIC=y' "$src/.config" || { echo "build-busybox: CONFIG_STATIC did not stick" >&2; exit 1; }
  grep -qx 'CONFIG_SH_IS_ASH=y' "$src/.config" || { echo "build-busybox: sh is not ash in defconfig" >&2; exit 1; }
  echo "build-busybox: building busybox $version (defconfig, static) ..." >&2
  log=$tmp/build.log
  make -C "$src" -j"$(nproc)" busybox >"$log" 2>&1 || { tail -40 "$log" >&2; echo "build-busybox: make failed" >&2; exit 1; }
  mkdir -p "$tmp/out"
  install -m 0755 "$src/busybox" "$tmp/out/busybox"
  cp "$src/.config" "$tmp/out/config"
  touch "$tmp/out/.complete"
  rm -rf "$dest"; mv "$tmp/out" "$dest"
  echo "build-busybox: built in $(( $(date +%s) - t0 )) s ($dest)" >&2
fi
mkdir -p "$out"
ln -sfn "$dest/busybox" "$out/busybox"
