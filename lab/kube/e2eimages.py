"""The images Kubernetes' e2e tests run, made on this machine (no registry is reachable), under the
exact names and tags e2e v1.34.4 asks for (``test/utils/image/manifest.go``); what the
``[Conformance]`` specs pull (every SIG's, not only sig-network's), with everything those Pods run
inside them:

| image | made of | used by |
|---|---|---|
| ``e2e-test-images/agnhost:2.56`` | Debian root file system (dig, curl, nc, ss, ip, ping, bash, getent) + the agnhost binary, ``/coredns``, porter's TLS pair | almost every spec: servers (netexec, porter, serve-hostname, webhook, crd-conversion-webhook), exec clients (curl, nc), DNS probes (dig), mounttest |
| ``e2e-test-images/jessie-dnsutils:1.7`` | the same Debian root file system (+ ``/coredns``) | the DNS specs' second prober (dig, getent) |
| ``e2e-test-images/nginx:1.14-4``, ``nginx:1.15-4`` | the same, ``nginx -g 'daemon off;'`` (Debian's nginx-light) | EndpointSlice, garbage collector, Pods, RC specs (Pods that only have to run) |
| ``e2e-test-images/httpd:2.4.38-4``, ``httpd:2.4.39-4`` | the same + Apache (Debian's apache2-bin) laid out as upstream's (``/usr/local/apache2/{conf,htdocs,logs}``, ``bin/httpd``), serving upstream's ``index.html`` ("It works!") on port 80 | Deployment, StatefulSet (readiness on ``/index.html``, which the specs ``mv`` away and back), DaemonSet, kubectl specs; 2.4.39-4 is the "new" image of rolling updates |
| ``e2e-test-images/nautilus:1.7``, ``kitten:1.7`` | agnhost's image + ``/data.json`` and the picture from the module's ``test/images/<name>/html``, ``agnhost test-webserver`` | kubectl's Update Demo (reads ``data.json`` through the Pod proxy) |
| ``e2e-test-images/nonewprivs:1.3`` | busybox + ``/usr/local/bin/nnp`` (``test/images/nonewprivs``, setuid root) | Security Context's AllowPrivilegeEscalation specs ("Effective uid: N") |
| ``e2e-test-images/nonroot:1.4`` | busybox, ``User 1234`` | Security Context's runAsNonRoot specs |
| ``e2e-test-images/busybox:1.37.0-1`` | busybox 1.37.0 built here as upstream's (``tools/build-busybox.sh``: ``defconfig``, static), every applet, ash as ``sh`` | the framework's default test image (``e2epod.GetDefaultTestImage``) |
| ``registry.k8s.io/pause:3.10.1`` | agnhost alone, ``agnhost pause`` (a pause that ends on SIGTERM) | scheduling, quota, namespace, Service latency specs |
| ``e2e-test-images/sample-apiserver:1.29.2`` | the Debian root file system + ``/sample-apiserver`` (``k8s.io/sample-apiserver`` at the lab's version, static), ``ENTRYPOINT ["/sample-apiserver"]`` as upstream's | the Aggregator spec's extension API server (the wardle.example.com group, served through an APIService) |
| ``registry.k8s.io/etcd:3.6.4-0`` | the Debian root file system + ``/usr/local/bin/etcd``, the lab's own etcd 3.6.4 | the same spec's second container, sample-apiserver's storage on 127.0.0.1:2379 |

etcd is the binary the lab's control plane runs (``tools/build-go-tools.sh kubernetes``), not a
second, static build: it is built with cgo against this machine's C library (Debian 12's glibc,
symbols up to GLIBC_2.34), and the root file system under it is Debian 12's too, already stored on
every Node for the other images, so the image costs only etcd's own layer.  sample-apiserver is
static, as agnhost: the root file system under it is only for what upstream's Alpine base gives a
shell in the container.

A second, small archive (:func:`build_cnp`) holds what the ClusterNetworkPolicy conformance suite
(``make conformance CONFORMANCE="--suite cnp"``, :mod:`lab.conformance.cnp`) runs: ``agnhost:2.45``
(the tag its base manifests name), an image of its own rather than 2.56's second name, because it
differs in one case: its ``/agnhost`` is :func:`agnhost_cnp_wrapper`, which runs upstream's agnhost
(``/agnhost-bin``) for every subcommand and keeps ``agnhost porter`` up (as ``agnhost pause``) when
this kernel refuses porter's SCTP listener. Upstream's porter exits then (``log.Fatal``), and the
suite's fixture StatefulSets each run two SCTP-only porters (ports 9003, 9005): no fixture Pod
would ever be Ready, and no test would run.

Upstream agnhost is Alpine with bind-tools, curl, netcat-openbsd, iproute2 and bash
(``test/images/agnhost/Dockerfile``); jessie-dnsutils is Debian with dnsutils; httpd is Alpine's
Apache 2.4.  Here every Debian-based image shares one root file system (``mmdebstrap``, as
``tools/build-image.sh`` makes Ferry's, cached by the same key scheme under
``/var/cache/ferry/image``), so a Node stores it once; so are agnhost's and busybox's layers.

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
from dataclasses import dataclass, fields

from lab import tools
from lab.kube import ociimage

E2E_REGISTRY = "registry.k8s.io/e2e-test-images"
AGNHOST = f"{E2E_REGISTRY}/agnhost:2.56"
JESSIE_DNSUTILS = f"{E2E_REGISTRY}/jessie-dnsutils:1.7"
NGINX = f"{E2E_REGISTRY}/nginx:1.14-4"
NGINX_NEW = f"{E2E_REGISTRY}/nginx:1.15-4"
HTTPD = f"{E2E_REGISTRY}/httpd:2.4.38-4"
HTTPD_NEW = f"{E2E_REGISTRY}/httpd:2.4.39-4"
NAUTILUS = f"{E2E_REGISTRY}/nautilus:1.7"
KITTEN = f"{E2E_REGISTRY}/kitten:1.7"
NONEWPRIVS = f"{E2E_REGISTRY}/nonewprivs:1.3"
NONROOT = f"{E2E_REGISTRY}/nonroot:1.4"
BUSYBOX = f"{E2E_REGISTRY}/busybox:1.37.0-1"
PAUSE = "registry.k8s.io/pause:3.10.1"
SAMPLE_APISERVER = f"{E2E_REGISTRY}/sample-apiserver:1.29.2"
ETCD = "registry.k8s.io/etcd:3.6.4-0"
AGNHOST_CNP = f"{E2E_REGISTRY}/agnhost:2.45"  # sigs.k8s.io/network-policy-api v0.3.0's conformance/base
NAMES = (AGNHOST, JESSIE_DNSUTILS, NGINX, NGINX_NEW, HTTPD, HTTPD_NEW, NAUTILUS, KITTEN, NONEWPRIVS, NONROOT,
         BUSYBOX, PAUSE, SAMPLE_APISERVER, ETCD)
NONROOT_USER = "1234"  # upstream's Dockerfile: USER 1234

DEBIAN_SUITE = "bookworm"
# dig/nslookup, curl, nc (OpenBSD's, as upstream's), ss/ip, ping, nginx, Apache (the binary and its
# modules, without Debian's configuration and service scripts: httpd_conf() is the configuration);
# bash, coreutils, getent come with the essential set.
ROOTFS_PACKAGES = ("apache2-bin", "bind9-dnsutils", "curl", "iproute2", "iputils-ping", "netcat-openbsd", "nginx-light")
IMAGE_CACHE = os.environ.get("FERRY_IMAGE_CACHE", "/var/cache/ferry/image")
E2E_CACHE = os.environ.get("FERRY_E2E_IMAGE_CACHE", "/var/cache/ferry/e2e-images")
CNP_FORMAT = 1  # the same for the cnp archive (:func:`build_cnp`)
FORMAT = 6  # bump when the images' make-up changes: the cached archive is keyed by it
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
    busybox: str  # busybox 1.37.0 as upstream's image has it (tools/build-busybox.sh)
    applets: Sequence[str]  # what ``busybox --list`` names
    nnp: str  # nonewprivs' static binary (tools/build-go-tools.sh kube-e2e-images)
    sample_apiserver: str  # k8s.io/sample-apiserver, static (tools/build-go-tools.sh kube-e2e-images)
    etcd: str  # the lab's etcd (tools/build-go-tools.sh kubernetes)
    images_src: str  # the module's test/images: httpd/index.html, nautilus/html, kitten/html


def agnhost_layer(p: Parts) -> tuple[ociimage.ImageSpec, tuple[str, ...]]:
    """agnhost's own layer (upstream's Dockerfile): /agnhost, /agnhost-2 (entrypoint tests),
    /coredns, porter's ``localhost.crt``/``.key`` in /, and /uploads (netexec)."""
    spec = ociimage.ImageSpec(name="", files={"agnhost": p.agnhost, "coredns": p.coredns,
                                              "localhost.crt": p.porter_crt, "localhost.key": p.porter_key},
                              symlinks={"agnhost-2": "agnhost"})
    return spec, ("uploads",)


BUSYBOX_DIRS = ("tmp",)  # upstream's busybox has /tmp (mode 1777): specs write there (Probing's /tmp/health)


def busybox_layer(p: Parts) -> ociimage.ImageSpec:
    """busybox with every applet, ``sh`` its own ash, as upstream's image (Docker's busybox:1.37.0).
    The busybox is built here from busybox's source with upstream's configuration
    (``tools/build-busybox.sh``), not Debian's busybox-static: Debian's ash drops environment
    variables whose names are no shell names (``data-1``) and so hides them from the commands it
    runs, while upstream's passes them on; ConfigMap's and Secret's ``envFrom`` specs (4) run ``sh -c
    env`` and look for ``data-1=value-1``, and Kubelet's read-only root spec compares ash's own
    message (``/bin/sh: can't create /file: Read-only file system``), which no other shell words so."""
    links = {f"bin/{a}": "busybox" for a in p.applets if a != "busybox"}
    return ociimage.ImageSpec(name="", files={"bin/busybox": p.busybox}, symlinks=links, modes={"tmp": 0o1777})


APACHE_ROOT = "usr/local/apache2"  # upstream httpd's ServerRoot: the StatefulSet specs mv its htdocs/index.html
APACHE_MODULES = ("mpm_event", "authz_core", "dir")  # what Debian's apache2 does not compile in and httpd_conf needs


def httpd_conf() -> str:
    """Apache's whole configuration (pure): upstream's defaults that the specs see (port 80, the
    document root ``/usr/local/apache2/htdocs``, ``index.html``), logs to the container's stdout and
    stderr as upstream's image does, children as www-data."""
    loads = "".join(f"LoadModule {m}_module /usr/lib/apache2/modules/mod_{m}.so\n" for m in APACHE_MODULES)
    return (f"ServerRoot /{APACHE_ROOT}\n{loads}ServerName localhost\nListen 80\nUser www-data\nGroup www-data\n"
            f"PidFile logs/httpd.pid\nDefaultRuntimeDir logs\nErrorLog /proc/self/fd/2\nLogLevel warn\n"
            'LogFormat "%h %l %u %t \\"%r\\" %>s %b" common\nCustomLog /proc/self/fd/1 common\n'
            f"DocumentRoot /{APACHE_ROOT}/htdocs\nDirectoryIndex index.html\n"
            f"<Directory />\n    Require all denied\n</Directory>\n"
            f"<Directory /{APACHE_ROOT}/htdocs>\n    Require all granted\n</Directory>\n")


def httpd_layer(conf: str, index_html: str) -> tuple[ociimage.ImageSpec, tuple[str, ...]]:
    """Upstream httpd's layout over the Debian root file system: ``conf/httpd.conf``,
    ``htdocs/index.html``, ``logs/``, and ``bin/httpd`` (Debian's ``/usr/sbin/apache2``)."""
    spec = ociimage.ImageSpec(name="", files={f"{APACHE_ROOT}/conf/httpd.conf": conf,
                                              f"{APACHE_ROOT}/htdocs/index.html": index_html},
                              symlinks={f"{APACHE_ROOT}/bin/httpd": "/usr/sbin/apache2"},
                              modes={f"{APACHE_ROOT}/conf/httpd.conf": 0o644,
                                     f"{APACHE_ROOT}/htdocs/index.html": 0o644})
    return spec, (f"{APACHE_ROOT}/logs",)


def picture_layer(html_dir: str) -> ociimage.ImageSpec:
    """nautilus's or kitten's: the files of the module's ``test/images/<name>/html`` in ``/``,
    where ``agnhost test-webserver`` serves them."""
    names = sorted(os.listdir(html_dir))
    return ociimage.ImageSpec(name="", files={n: os.path.join(html_dir, n) for n in names},
                              modes=dict.fromkeys(names, 0o644))


def nnp_layer(nnp: str) -> ociimage.ImageSpec:
    """``/usr/local/bin/nnp``, setuid root as upstream's ``chmod +s``: it prints its effective uid,
    0 unless no_new_privs (allowPrivilegeEscalation: false) kept the Pod's."""
    return ociimage.ImageSpec(name="", files={"usr/local/bin/nnp": nnp}, modes={"usr/local/bin/nnp": 0o6755})


SAMPLE_APISERVER_PATH = "sample-apiserver"  # upstream's Dockerfile: ADD sample-apiserver /sample-apiserver
ETCD_PATH = "usr/local/bin/etcd"  # where e2e's Deployment runs it from (aggregator.go: /usr/local/bin/etcd)


def binary_layer(path: str, binary: str) -> ociimage.ImageSpec:
    """One executable at ``path`` (sample-apiserver's, etcd's layer)."""
    return ociimage.ImageSpec(name="", files={path: binary})


@dataclass(frozen=True)
class Layers:
    """The layer files the images are made of (tar files on disk)."""

    rootfs: str
    agnhost: str
    busybox: str
    httpd: str
    nautilus: str
    kitten: str
    nnp: str
    sample_apiserver: str
    etcd: str


def layer_names() -> Layers:
    """Each layer as its own name: what :func:`images` makes of them, without files."""
    return Layers(*(f.name for f in fields(Layers)))


def images(layers: Layers) -> list[ociimage.LayeredImage]:
    """The images from their layer files (pure), in :data:`NAMES`' order."""
    r, a, b = layers.rootfs, layers.agnhost, layers.busybox
    nginx = ("nginx", "-g", "daemon off;")
    httpd_env = (f"PATH=/{APACHE_ROOT}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    httpd = ("httpd", "-f", f"/{APACHE_ROOT}/conf/httpd.conf", "-DFOREGROUND")

    def httpd_image(name: str) -> ociimage.LayeredImage:
        version = name.rpartition(":")[2]
        return ociimage.LayeredImage(name, (r, layers.httpd), cmd=httpd, env=(*httpd_env, f"HTTPD_VERSION={version}"),
                                     workdir=f"/{APACHE_ROOT}")

    return [
        ociimage.LayeredImage(AGNHOST, (r, a), entrypoint=("/agnhost",), cmd=("pause",)),
        ociimage.LayeredImage(JESSIE_DNSUTILS, (r, a), cmd=("/bin/sh",)),
        ociimage.LayeredImage(NGINX, (r,), cmd=nginx),
        ociimage.LayeredImage(NGINX_NEW, (r,), cmd=nginx),
        httpd_image(HTTPD),
        httpd_image(HTTPD_NEW),
        ociimage.LayeredImage(NAUTILUS, (r, a, layers.nautilus), entrypoint=("/agnhost",), cmd=("test-webserver",)),
        ociimage.LayeredImage(KITTEN, (r, a, layers.kitten), entrypoint=("/agnhost",), cmd=("test-webserver",)),
        ociimage.LayeredImage(NONEWPRIVS, (b, layers.nnp), cmd=("nnp",), env=("PATH=/usr/local/bin:/bin",)),
        ociimage.LayeredImage(NONROOT, (b,), cmd=("sh",), env=("PATH=/bin",), user=NONROOT_USER),
        ociimage.LayeredImage(BUSYBOX, (b,), cmd=("sh",), env=("PATH=/bin",)),
        ociimage.LayeredImage(PAUSE, (a,), entrypoint=("/agnhost", "pause")),
        ociimage.LayeredImage(SAMPLE_APISERVER, (r, layers.sample_apiserver),
                              entrypoint=(f"/{SAMPLE_APISERVER_PATH}",)),
        ociimage.LayeredImage(ETCD, (r, layers.etcd), cmd=(f"/{ETCD_PATH}",)),
    ]


def rootfs_key(packages: Sequence[str] = ROOTFS_PACKAGES, suite: str = DEBIAN_SUITE) -> str:
    """tools/build-image.sh's cache key for a root file system (``echo "bookworm essential
    <packages>" | sha256sum``), so both share /var/cache/ferry/image."""
    return hashlib.sha256(f"{suite} essential {','.join(packages)}\n".encode()).hexdigest()[:12]


def inputs_key(p: Parts) -> str:
    """The cached archive's key: the files it is made of (path, size, mtime; Go builds live in
    directories keyed by their inputs), the applets, the image definitions and :data:`FORMAT`."""
    files = [p.rootfs, p.agnhost, p.coredns, p.porter_crt, p.porter_key, p.busybox, p.nnp, p.sample_apiserver,
             p.etcd,
             os.path.join(p.images_src, "httpd", "index.html"),
             *(os.path.join(p.images_src, n, "html", f) for n in ("nautilus", "kitten")
               for f in sorted(os.listdir(os.path.join(p.images_src, n, "html"))))]
    stamp = [(os.path.realpath(f), os.path.getsize(f), int(os.path.getmtime(f))) for f in files]
    defs = [(i.name, i.entrypoint, i.cmd, i.env, i.workdir, i.user, i.layers) for i in images(layer_names())]
    doc = json.dumps({"files": stamp, "applets": list(p.applets), "images": defs, "httpd": httpd_conf(),
                      "format": FORMAT})
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


def busybox_applets(busybox: str) -> list[str]:
    """What ``busybox --list`` names: each becomes a link in the image's /bin."""
    cp = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=False)
    names = sorted({a for a in cp.stdout.split() if re.fullmatch(r"[a-z0-9_.\[-]+", a) and "/" not in a})
    if cp.returncode != 0 or "sh" not in names:
        raise ImageBuildError(f"{busybox} --list: no applets (tools/build-busybox.sh builds it)")
    return names


def parts(log: Log) -> Parts:
    for name in ("agnhost", "coredns", "nnp", "sample-apiserver", "etcd"):
        if not os.access(tools.tool(name), os.X_OK):
            raise ImageBuildError(f"{tools.tool(name)} missing: run "
                                  "`tools/build-go-tools.sh kubernetes kube-e2e kube-e2e-images coredns`")
    if not os.access(tools.tool("busybox"), os.X_OK):
        raise ImageBuildError(f"{tools.tool('busybox')} missing: run `tools/build-busybox.sh`")
    src = os.path.join(kubernetes_module_dir(), "test", "images")
    porter = os.path.join(src, "agnhost", "porter")
    return Parts(rootfs=ensure_rootfs(log), agnhost=tools.tool("agnhost"), coredns=tools.tool("coredns"),
                 porter_crt=os.path.join(porter, "localhost.crt"), porter_key=os.path.join(porter, "localhost.key"),
                 busybox=tools.tool("busybox"), applets=busybox_applets(tools.tool("busybox")), nnp=tools.tool("nnp"),
                 sample_apiserver=tools.tool("sample-apiserver"), etcd=tools.tool("etcd"), images_src=src)


def build(log: Log, cache: str = E2E_CACHE) -> str:
    """The archive of every image in :data:`NAMES` (cached by :func:`inputs_key`; older archives
    in ``cache`` are removed when a new one is written). Returns its path."""
    p = parts(log)
    key = inputs_key(p)
    path = os.path.join(cache, f"e2e-images-{key}.tar")
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    log(f"writing the e2e images archive ({', '.join(n.rpartition('/')[2] for n in NAMES)})")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".layers-") as tmp:
        def layer(spec: ociimage.ImageSpec, name: str, dirs: Sequence[str] = ()) -> str:
            return ociimage.write_layer(spec, os.path.join(tmp, f"{name}.tar"), dirs)

        conf = os.path.join(tmp, "httpd.conf")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(httpd_conf())
        spec, dirs = agnhost_layer(p)
        hspec, hdirs = httpd_layer(conf, os.path.join(p.images_src, "httpd", "index.html"))
        layers = Layers(rootfs=p.rootfs, agnhost=layer(spec, "agnhost", dirs),
                        busybox=layer(busybox_layer(p), "busybox", BUSYBOX_DIRS),
                        httpd=layer(hspec, "httpd", hdirs),
                        nautilus=layer(picture_layer(os.path.join(p.images_src, "nautilus", "html")), "nautilus"),
                        kitten=layer(picture_layer(os.path.join(p.images_src, "kitten", "html")), "kitten"),
                        nnp=layer(nnp_layer(p.nnp), "nnp"),
                        sample_apiserver=layer(binary_layer(SAMPLE_APISERVER_PATH, p.sample_apiserver),
                                               "sample-apiserver"),
                        etcd=layer(binary_layer(ETCD_PATH, p.etcd), "etcd"))
        ociimage.write_layered_archive(images(layers), path)
    for old in os.listdir(cache):
        if old.startswith("e2e-images-") and old.endswith(".tar") and old != os.path.basename(path):
            os.unlink(os.path.join(cache, old))
    return path


# ---------------------------------------------------------------- the ClusterNetworkPolicy suite's image

PORTER_SCTP_REFUSED = "Failed to listen SCTP. error:.*protocol not supported"  # upstream porter's log.Fatal


def agnhost_cnp_wrapper() -> str:
    """``/agnhost`` of :data:`AGNHOST_CNP` (pure): upstream's agnhost (``/agnhost-bin``) for every
    subcommand; ``porter`` too, and when porter exited on this kernel's refusal of its SCTP
    listener (EPROTONOSUPPORT), it says so and holds the container up as ``agnhost pause``: the
    SCTP ports stay unserved, and the suite's SCTP probes fail by the rule that names them."""
    return ("#!/bin/bash\n"
            "# agnhost:2.45 as ferry-lab makes it (lab/kube/e2eimages.py, agnhost_cnp_wrapper)\n"
            'if [ "$1" != porter ]; then exec /agnhost-bin "$@"; fi\n'
            "log=$(mktemp)\n"
            '/agnhost-bin "$@" 2>&1 | tee "$log"\n'
            "rc=${PIPESTATUS[0]}\n"
            f"if grep -q '{PORTER_SCTP_REFUSED}' \"$log\"; then\n"
            '  echo "agnhost porter: this kernel has no SCTP sockets: its SCTP ports are not served, the Pod stays up'
            ' (ferry-lab, rule sctp)"\n'
            "  exec /agnhost-bin pause\n"
            "fi\n"
            'exit "$rc"\n')


def cnp_images(rootfs: str, layer: str) -> list[ociimage.LayeredImage]:
    """The cnp suite's images (pure): agnhost:2.45 as upstream's agnhost image is run (entrypoint
    ``/agnhost``, ``pause`` by default), over the e2e images' Debian root file system."""
    return [ociimage.LayeredImage(AGNHOST_CNP, (rootfs, layer), entrypoint=("/agnhost",), cmd=("pause",))]


def build_cnp(log: Log, cache: str = E2E_CACHE) -> str:
    """The archive of :func:`cnp_images` (``cnp-images-<key>.tar`` in ``cache``, keyed by its
    inputs). Returns its path."""
    if not os.access(tools.tool("agnhost"), os.X_OK):
        raise ImageBuildError(f"{tools.tool('agnhost')} missing: run `tools/build-go-tools.sh kube-e2e`")
    rootfs, agnhost = ensure_rootfs(log), tools.tool("agnhost")
    stamp = [(os.path.realpath(f), os.path.getsize(f), int(os.path.getmtime(f))) for f in (rootfs, agnhost)]
    doc = json.dumps({"files": stamp, "wrapper": agnhost_cnp_wrapper(), "format": CNP_FORMAT})
    path = os.path.join(cache, f"cnp-images-{hashlib.sha256(doc.encode()).hexdigest()[:16]}.tar")
    if os.path.exists(path):
        return path
    os.makedirs(cache, exist_ok=True)
    log(f"writing the cnp suite's image archive ({AGNHOST_CNP.rpartition('/')[2]})")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".layers-") as tmp:
        wrapper = os.path.join(tmp, "agnhost.sh")
        with open(wrapper, "w", encoding="utf-8") as f:
            f.write(agnhost_cnp_wrapper())
        spec = ociimage.ImageSpec(name="", files={"agnhost": wrapper, "agnhost-bin": agnhost})
        layer = ociimage.write_layer(spec, os.path.join(tmp, "agnhost-cnp.tar"))
        ociimage.write_layered_archive(cnp_images(rootfs, layer), path)
    for old in os.listdir(cache):
        if old.startswith("cnp-images-") and old.endswith(".tar") and old != os.path.basename(path):
            os.unlink(os.path.join(cache, old))
    return path
