"""OCI image archives made from local files: the lab's pause and workload images, since no registry
is reachable. An image is one layer (a tar of the files given) plus its config, in an OCI image
layout tarball that ``ctr images import`` (and ``podman load``) read.

The layer is built deterministically (sorted entries, fixed mtimes and owners): the same files give
the same digest, so a re-import is a no-op."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
BUSYBOX = "/bin/busybox"
# busybox applets the lab's Pods use: a shell, sleep, ping and nc (probes), ip (checks), httpd.
APPLETS = ("sh", "sleep", "ping", "ping6", "nc", "ip", "cat", "ls", "echo", "hostname", "httpd", "wget",
           "ifconfig", "true", "kill", "ps", "mkdir", "timeout", "nslookup", "seq", "grep")


@dataclass(frozen=True)
class ImageSpec:
    """``name`` (a full reference, e.g. ``ferry.local/busybox:1``), the files of its one layer
    (path in the image -> path on this machine), symlinks (path -> target), and its config."""

    name: str
    files: Mapping[str, str]
    symlinks: Mapping[str, str] = field(default_factory=dict)
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/bin:/usr/bin:/sbin:/usr/sbin",)


def busybox_image(name: str, cmd: Sequence[str] = ("sh",)) -> ImageSpec:
    """busybox-static and links for :data:`APPLETS`: enough for ping/TCP probes and a pause Pod."""
    return ImageSpec(name=name, files={"bin/busybox": BUSYBOX},
                     symlinks={f"bin/{a}": "busybox" for a in APPLETS}, cmd=tuple(cmd))


def _layer(spec: ImageSpec) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({os.path.dirname(p) for p in (*spec.files, *spec.symlinks)} - {""})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for path in sorted(spec.files):
            with open(spec.files[path], "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            tar.addfile(info, io.BytesIO(data))
        for path in sorted(spec.symlinks):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, spec.symlinks[path], 0o777, 0
            tar.addfile(info)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def archive(spec: ImageSpec) -> bytes:
    """The OCI image layout of ``spec`` as one tar (what ``ctr images import`` reads)."""
    layer_digest, layer = _blob(_layer(spec))
    config: dict = {"architecture": "amd64", "os": "linux",
                    "config": {"Env": list(spec.env)},
                    "rootfs": {"type": "layers", "diff_ids": [layer_digest]}}
    if spec.entrypoint:
        config["config"]["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        config["config"]["Cmd"] = list(spec.cmd)
    config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
    manifest = {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
                "layers": [{"mediaType": MEDIA_LAYER, "digest": layer_digest, "size": len(layer)}]}
    manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
    index = {"schemaVersion": 2, "mediaType": MEDIA_INDEX,
             "manifests": [{"mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": len(manifest_bytes),
                            "annotations": {"io.containerd.image.name": spec.name,
                                            "org.opencontainers.image.ref.name": spec.name}}]}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        def add(path: str, data: bytes) -> None:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in ((layer_digest, layer), (config_digest, config_bytes),
                             (manifest_digest, manifest_bytes)):
            add("blobs/sha256/" + digest.split(":", 1)[1], data)
    return out.getvalue()


def write_archive(spec: ImageSpec, path: str) -> str:
    """Writes :func:`archive` to ``path`` (replaced atomically); returns ``path``."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(archive(spec))
    os.replace(tmp, path)
    return path
