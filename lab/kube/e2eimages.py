"""The images Kubernetes' e2e tests run, made on this machine (no registry is reachable), under the
exact names and tags e2e v1.34.4 asks for (``test/utils/image/manifest.go``); what the
``[sig-network] ... [Conformance]`` specs pull, with everything those Pods run inside them:

| image | made of | used by |
|---|---|---|
| ``e2e-test-images/agnhost:2.56`` | Debian root file system (dig, curl, nc, ss, ip, ping, bash, getent) + the agnhost binary, ``/coredns``, porter's TLS pair | almost every spec: servers (netexec, porter, serve-hostname), exec clients (curl, nc), DNS probes (dig) |
| ``e2e-test-images/jessie-dnsutils:1.7`` | the same Debian root file system (+ ``/coredns``) | the DNS specs' second prober (dig, getent) |
| ``e2e-test-images/nginx:1.14-4`` | the same, ``nginx -g 'daemon off;'`` (Debian's nginx-light) | EndpointSlice specs (Pods that only have to run) |
| ``e2e-test-images/busybox:1.37.0-1`` | busybox-static with every applet | the framework's default test image (``e2epod.GetDefaultTestImage``) |
| ``registry.k8s.io/pause:3.10.1`` | agnhost alone, ``agnhost pause`` (a pause that ends on SIGTERM) | the Service latency spec's Deployment |

Upstream agnhost is Alpine with bind-tools, curl, netcat-openbsd, iproute2 and bash
(``test/images/agnhost/Dockerfile``); jessie-dnsutils is Debian with dnsutils.  Here every
Debian-based image shares one root file system (``mmdebstrap``, as ``tools/build-image.sh`` makes
Ferry's, cached by the same key scheme under ``/var/cache/ferry/image``), so a Node stores it once.

:func:`build` writes one OCI archive holding all of them (``ctr images import`` imports every
name), cached under ``/var/cache/ferry/e2e-images`` by its inputs; importing it after the lab's
own images replaces the lab's busybox-based agnhost (:mod:`lab.kube.dns`) with this one."""  # noqa: E501 (the table)

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lab import tools
from lab.kube import ociimage

E2E_REGISTRY = "registry.k8s.io/e2e-test-images"
AGNHOST = f"{E2E_REGISTRY}/agnhost:2.56"
JESSIE_DNSUTILS = f"{E2E_REGISTRY}/jessie-dnsutils:1.7"
NGINX = f"{E2E_REGISTRY}/nginx:1.14-4"
BUSYBOX = f"{E2E_REGISTRY}/busybox:1.37.0-1"
PAUSE = "registry.k8s.io/pause:3.10.1"
NAMES = (AGNHOST, JESSIE_DNSUTILS, NGINX, BUSYBOX, PAUSE)

DEBIAN_SUITE = "bookworm"
# dig/nslookup, curl, nc (OpenBSD's, as upstream's), ss/ip, ping, nginx; bash, coreutils, getent
# come with the essential set.
ROOTFS_PACKAGES = ("bind9-dnsutils", "curl", "iproute2", "iputils-ping", "netcat-openbsd", "nginx-light")
IMAGE_CACHE = os.environ.get("FERRY_IMAGE_CACHE", "/var/cache/ferry/image")
E2E_CACHE = os.environ.get("FERRY_E2E_IMAGE_CACHE", "/var/cache/ferry/e2e-images")
FORMAT = 1  # bump when the images' make-up changes: the cached archive is keyed by it
Log = Callable[[str], None]


class ImageBuildError(RuntimeError):
    """Something the images need is missing or failed to build; the message says what."""


# ---------------------------------------------------------------- what each image is (pure)

@dataclass(frozen=True)
class Parts:
    """Where an image's parts are on this machine."""

    rootfs: str  # Debian root file system tarball (mmdebstrap)
    agnhost: str  # the static agnhost binary
    coredns: str  # the static CoreDNS binary (upstream's agnhost and jessie-dnsutils carry /coredns)
    porter_crt: str  # agnhost porter's TLS pair, read from the working directory (/)
    porter_key: str
    busybox: str  # busybox-static
    applets: Sequence[str]  # what ``busybox --list`` names


def agnhost_layer(p: Parts) -> tuple[ociimage.ImageSpec, tuple[str, ...]]:
    """agnhost's own layer (upstream's Dockerfile): /agnhost, /agnhost-2 (entrypoint tests),
    /coredns, porter's ``localhost.crt``/``.key`` in /, and /uploads (netexec)."""
    spec = ociimage.ImageSpec(name="", files={"agnhost": p.agnhost, "coredns": p.coredns,
                                              "localhost.crt": p.porter_crt, "localhost.key": p.porter_key},
                              symlinks={"agnhost-2": "agnhost"})
    return spec, ("uploads",)


def busybox_layer(p: Parts) -> ociimage.ImageSpec:
    return ociimage.ImageSpec(name="", files={"bin/busybox": p.busybox},
                              symlinks={f"bin/{a}": "busybox" for a in p.applets if a != "busybox"})


def images(rootfs: str, agnhost: str, busybox: str) -> list[ociimage.LayeredImage]:
    """The images from their layer files (pure)."""
    return [
        ociimage.LayeredImage(AGNHOST, (rootfs, agnhost), entrypoint=("/agnhost",), cmd=("pause",)),
        ociimage.LayeredImage(JESSIE_DNSUTILS, (rootfs, agnhost), cmd=("/bin/sh",)),
        ociimage.LayeredImage(NGINX, (rootfs,), cmd=("nginx", "-g", "daemon off;")),
        ociimage.LayeredImage(BUSYBOX, (busybox,), cmd=("sh",), env=("PATH=/bin",)),
        ociimage.LayeredImage(PAUSE, (agnhost,), entrypoint=("/agnhost", "pause")),
    ]


def rootfs_key(packages: Sequence[str] = ROOTFS_PACKAGES, suite: str = DEBIAN_SUITE) -> str:
    """tools/build-image.sh's cache key for a root file system (``echo "bookworm essential
    <packages>" | sha256sum``), so both share /var/cache/ferry/image."""
    return hashlib.sha256(f"{suite} essential {','.join(packages)}\n".encode()).hexdigest()[:12]


def inputs_key(p: Parts) -> str:
    """The cached archive's key: the files it is made of (path, size, mtime; Go builds live in
    directories keyed by their inputs), the applets, the image definitions and :data:`FORMAT`."""
    files = [p.rootfs, p.agnhost, p.coredns, p.porter_crt, p.porter_key, p.busybox]
    stamp = [(os.path.realpath(f), os.path.getsize(f), int(os.path.getmtime(f))) for f in files]
    defs = [(i.name, i.entrypoint, i.cmd, i.env, len(i.layers)) for i in images("r", "a", "b")]
    doc = json.dumps({"files": stamp, "applets": list(p.applets), "images": defs, "format": FORMAT})
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- making them

def ensure_rootfs(log: Log, packages: Sequence[str] = ROOTFS_PACKAGES, cache: str = IMAGE_CACHE) -> str:
    """The Debian root file system with ``packages`` (mmdebstrap, cached like tools/build-image.sh)."""
    key = rootfs_key(packages)
    base = os.path.join(cache, f"rootfs-{key}.tar")
    if os.path.exists(base):
        return base
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed (apt-get install mmdebstrap)")
    os.makedirs(cache, exist_ok=True)
    log(f"making the e2e images' Debian root file system ({','.join(packages)}), once")
    partial = os.path.join(cache, f".partial-{key}.tar")
    cp = subprocess.run(["mmdebstrap", "--quiet", "--variant=essential", f"--include={','.join(packages)}",
                         "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
                         "--dpkgopt=path-exclude=/usr/share/locale/*", DEBIAN_SUITE, partial],
                        capture_output=True, text=True, check=False)
    if cp.returncode != 0:
        raise ImageBuildError(f"mmdebstrap failed: {cp.stderr.strip()[-800:]}")
    os.replace(partial, base)
    return base


def kubernetes_module_dir() -> str:
    """Where the Go module k8s.io/kubernetes (tools/kubernetes/go.mod's version) is unpacked:
    ``go mod download`` answers from the module cache, or fetches it through the module proxy."""
    mod = os.path.join(tools.REPO, "tools", "kubernetes")
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOTOOLCHAIN": "local"}
    try:
        cp = subprocess.run(["go", "mod", "download", "-json", "k8s.io/kubernetes"], cwd=mod, env=env,
                            capture_output=True, text=True, check=False, timeout=600)
    except FileNotFoundError:
        raise ImageBuildError("no 'go' on PATH: agnhost's TLS pair comes from the k8s.io/kubernetes module") from None
    if cp.returncode != 0:
        raise ImageBuildError(f"go mod download k8s.io/kubernetes: {(cp.stderr or cp.stdout).strip()[-400:]}")
    return str(json.loads(cp.stdout)["Dir"])


def busybox_applets(busybox: str = ociimage.BUSYBOX) -> list[str]:
    cp = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=False)
    names = sorted({a for a in cp.stdout.split() if re.fullmatch(r"[a-z0-9_.\[-]+", a) and "/" not in a})
    if cp.returncode != 0 or "sh" not in names:
        raise ImageBuildError(f"{busybox} --list: no applets (is busybox-static installed?)")
    return names


def parts(log: Log) -> Parts:
    for name in ("agnhost", "coredns"):
        if not os.access(tools.tool(name), os.X_OK):
            raise ImageBuildError(f"{tools.tool(name)} missing: run `tools/build-go-tools.sh kube-e2e coredns`")
    porter = os.path.join(kubernetes_module_dir(), "test", "images", "agnhost", "porter")
    return Parts(rootfs=ensure_rootfs(log), agnhost=tools.tool("agnhost"), coredns=tools.tool("coredns"),
                 porter_crt=os.path.join(porter, "localhost.crt"), porter_key=os.path.join(porter, "localhost.key"),
                 busybox=ociimage.BUSYBOX, applets=busybox_applets())


def build(log: Log, cache: str = E2E_CACHE) -> str:
    """The archive of every image in :data:`NAMES` (cached by :func:`inputs_key`; older archives
    in ``cache`` are removed when a new one is written). Returns its path."""
    p = parts(log)
    key = inputs_key(p)
    path = os.path.join(cache, f"e2e-images-{key}.tar")
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    log("writing the e2e images archive (agnhost, jessie-dnsutils, nginx, busybox, pause)")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".layers-") as tmp:
        spec, dirs = agnhost_layer(p)
        agnhost = ociimage.write_layer(spec, os.path.join(tmp, "agnhost.tar"), dirs)
        busybox = ociimage.write_layer(busybox_layer(p), os.path.join(tmp, "busybox.tar"))
        ociimage.write_layered_archive(images(p.rootfs, agnhost, busybox), path)
    for old in os.listdir(cache):
        if old.startswith("e2e-images-") and old.endswith(".tar") and old != os.path.basename(path):
            os.unlink(os.path.join(cache, old))
    return path
