"""A released Ferry, as the lab installs it (``kubernetes.release``) and the upgrade test starts
from: its chart and its image, built from its git tag by ``tools/build-release-image.sh`` (``make
release-image``) into ``build/release/<tag>/``: ``src/`` (the tag's tree, whose chart is
``src/deploy/helm/ferry``) and ``image.tar`` (the image its own tools/build-image.sh made).

``deploy/previous-release`` names the release this tree upgrades from and rolls back to."""

from __future__ import annotations

import os
import re

from lab.kube import manifests
from lab.kube.spec import RELEASE_TAG
from lab.sh import LabError

PREVIOUS_RELEASE_FILE = os.path.join(manifests.REPO, "deploy", "previous-release")
RELEASES_DIR = os.path.join(manifests.REPO, "build", "release")


def previous() -> str:
    """The tag ``deploy/previous-release`` names (the first word of its first line that is not a
    comment; the second is the commit the tag names, which tools/build-release-image.sh builds)."""
    with open(PREVIOUS_RELEASE_FILE, encoding="utf-8") as f:
        lines = [line.split() for line in f if line.strip() and not line.startswith("#")]
    if not lines or len(lines[0]) != 2 or not RELEASE_TAG.match(lines[0][0]) \
            or not re.fullmatch(r"[0-9a-f]{40}", lines[0][1]):
        raise LabError(f"{PREVIOUS_RELEASE_FILE}: expected a release tag and its commit "
                       f"(v0.1.0 <40 hex digits>), found {lines[:1]}")
    return lines[0][0]


def directory(tag: str) -> str:
    return os.path.join(RELEASES_DIR, tag)


def chart(tag: str) -> str:
    return os.path.join(directory(tag), "src", "deploy", "helm", "ferry")


def image_archive(tag: str) -> str:
    return os.path.join(directory(tag), "image.tar")


def image_ref(tag: str) -> str:
    """The image the release's own manifest names (``ferry-cni/ferry:<its version>``)."""
    return manifests.shipped_image(manifests.load(os.path.join(directory(tag), "src", "deploy", "ferry.yaml")))


def require(tag: str) -> None:
    """The release's chart and image are built, or a LabError that says how to build them."""
    for path in (chart(tag), image_archive(tag)):
        if not os.path.exists(path):
            raise LabError(f"release {tag}: {path} missing: run `make release-image` "
                           f"(tools/build-release-image.sh {tag})")


__all__ = ["PREVIOUS_RELEASE_FILE", "chart", "directory", "image_archive", "image_ref", "previous", "require"]
