#!/usr/bin/env bash
# `make release-image`: a released Ferry's chart and image, built from its git tag, for the
# upgrade test (tests/e2e/kube/test_kube_upgrade.py) and `ferry-lab up` with kubernetes.release.
#   tools/build-release-image.sh [TAG]        (default: the release deploy/previous-release names)
# Out: build/release/<TAG>/src (the tag's tree: its chart is src/deploy/helm/ferry) and
# build/release/<TAG>/image.tar (its image, an OCI archive, as its own tools/build-image.sh made it).
# The image is cached outside the clone by the tag's commit (a fresh machine builds it once: the
# tag's bundle by PyInstaller, ~1-2 min, then its image). The tag's bundle is frozen by this
# tree's bundle venv (.venv-dist): a release whose Python dependencies differ from this tree's
# is refused here, with the difference, rather than frozen against the wrong libraries.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dist_venv=${FERRY_DIST_VENV:-$here/.venv-dist}
cache=${FERRY_IMAGE_CACHE:-/var/cache/ferry/image}
release=$(grep -v '^#' "$here/deploy/previous-release" | head -1)
tag=${1:-${release%% *}}
pinned=; [ "$tag" = "${release%% *}" ] && pinned=${release#* }
out=$here/build/release/$tag
commit=$(git -C "$here" rev-parse --verify --quiet "refs/tags/$tag^{commit}") || commit=
if [ -n "$pinned" ]; then
  # deploy/previous-release pins the tag's commit: a clone without tags (CI's) builds from it
  [ -z "$commit" ] || [ "$commit" = "$pinned" ] || {
    echo "build-release-image: tag $tag is $commit, deploy/previous-release says $pinned" >&2; exit 1; }
  commit=$pinned
  git -C "$here" cat-file -e "$commit^{commit}" 2>/dev/null || git -C "$here" fetch --quiet origin "$commit" 2>/dev/null || {
    echo "build-release-image: $tag's commit $commit is not in $here (a shallow clone? git fetch --unshallow)" >&2; exit 1; }
elif [ -z "$commit" ]; then
  git -C "$here" fetch --quiet --tags origin 2>/dev/null || true
  commit=$(git -C "$here" rev-parse --verify --quiet "refs/tags/$tag^{commit}") || {
    echo "build-release-image: no tag $tag in $here (clone with its tags: git fetch --tags)" >&2; exit 1; }
fi
deps() { sed -n '/^dependencies = \[/,/^\]/p; /^dist = \[/,/^\]/p'; }
if ! diff <(git -C "$here" show "$commit:pyproject.toml" | deps) <(deps <"$here/pyproject.toml") >&2; then
  echo "build-release-image: $tag's Python dependencies (above, <) differ from this tree's (>):" \
       "freeze it in a bundle venv of its own (FERRY_DIST_VENV)" >&2
  exit 1
fi
rm -rf "$out"; mkdir -p "$out/src" "$cache"
git -C "$here" archive "$commit" | tar -x -C "$out/src"
cached=$cache/release-$tag-${commit:0:12}.tar
if [ -f "$cached" ]; then
  echo "build-release-image: $tag's image cached ($cached)" >&2
else
  t0=$(date +%s)
  echo "build-release-image: $tag ($commit): its bundle (PyInstaller on its build.spec), then its image ..." >&2
  # build.spec's pathex is its own directory: the tag's modules, not this tree's (installed editable in the venv)
  (cd "$out/src" && "$dist_venv/bin/pyinstaller" --noconfirm --log-level WARN --distpath "$out/src/dist" \
     --workpath "$out/src/build/pyi" build.spec >&2)
  archive=$(FERRY_IMAGE_CACHE=$cache bash "$out/src/tools/build-image.sh" | tail -1)
  mv "$archive" "$cache/.partial-$tag.tar"
  mv "$cache/.partial-$tag.tar" "$cached"
  rm -rf "$out/src/dist" "$out/src/build"
  echo "build-release-image: $tag's image in $(( $(date +%s) - t0 )) s" >&2
fi
ln -f "$cached" "$out/image.tar" 2>/dev/null || cp "$cached" "$out/image.tar"
echo "$out"
