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
from collections.abc import Callable, Mapping, Sequence
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
    modes: Mapping[str, int] = field(default_factory=dict)  # a file's or directory's mode when not 0o755 (setuid, /tmp)


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
            info.size, info.mode, info.mtime = len(data), spec.modes.get(path, 0o755), 0
            tar.addfile(info, io.BytesIO(data))
        for path in sorted(spec.symlinks):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, spec.symlinks[path], 0o777, 0
            tar.addfile(info)
    return buf.getvalue()


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _start_layout(tar: tarfile.TarFile, index: dict) -> Callable[[str, bytes], None]:
    """Write an OCI layout's ``oci-layout`` and ``index.json`` into ``tar``; returns the function
    that adds a file (fixed mode and mtime) for the blobs."""
    def add(name: str, data: bytes) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), 0o644, 0
        tar.addfile(info, io.BytesIO(data))
    add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    add("index.json", json.dumps(index, sort_keys=True).encode())
    return add


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
        add = _start_layout(tar, index)
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


# ---------------------------------------------------------------- images of several layers, streamed

@dataclass(frozen=True)
class LayeredImage:
    """An image whose layers are uncompressed tar files on disk, bottom first: e.g. a Debian root
    file system from ``mmdebstrap``, then a layer :func:`write_layer` made.  Layers are read from
    disk, never held in memory: a root file system is a few hundred MB."""

    name: str
    layers: Sequence[str]
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    workdir: str = ""
    user: str = ""  # the config's User (a uid, or uid:gid); empty: root


def write_layer(spec: ImageSpec, path: str, dirs: Sequence[str] = ()) -> str:
    """The one layer of ``spec`` (its files, symlinks, and the empty directories ``dirs``) as a tar
    file at ``path``, files streamed from disk; deterministic like :func:`archive`'s layer."""
    tmp = f"{path}.tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        every = (*spec.files, *spec.symlinks, *(f"{d}/x" for d in dirs))
        for d in sorted({p for q in every for p in _parents(q)}):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, spec.modes.get(d, 0o755), 0
            tar.addfile(info)
        for p in sorted(spec.files):
            info = tarfile.TarInfo(p)
            info.size, info.mode, info.mtime = os.path.getsize(spec.files[p]), spec.modes.get(p, 0o755), 0
            with open(spec.files[p], "rb") as f:
                tar.addfile(info, f)
        for p in sorted(spec.symlinks):
            info = tarfile.TarInfo(p)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, spec.symlinks[p], 0o777, 0
            tar.addfile(info)
    os.replace(tmp, path)
    return path


def _parents(path: str) -> list[str]:
    """``a/b/c`` -> ``["a", "a/b"]``."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def file_digest(path: str) -> str:
    """``sha256:<hex>`` of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def layered_index(images: Sequence[LayeredImage], digests: Mapping[str, str]
                  ) -> tuple[dict, dict[str, bytes], dict[str, str]]:
    """The OCI index of ``images`` (pure): ``digests`` maps each layer file to its digest.
    Returns (index, small blobs by digest: configs and manifests, layer files by digest)."""
    blobs: dict[str, bytes] = {}
    layer_files: dict[str, str] = {}
    manifests = []
    for im in images:
        ids = [digests[p] for p in im.layers]
        layer_files.update(zip(ids, im.layers))
        config: dict = {"architecture": "amd64", "os": "linux", "config": {"Env": list(im.env)},
                        "rootfs": {"type": "layers", "diff_ids": ids}}
        for key, value in (("Entrypoint", list(im.entrypoint)), ("Cmd", list(im.cmd)), ("WorkingDir", im.workdir),
                           ("User", im.user)):
            if value:
                config["config"][key] = value
        config_digest, config_bytes = _blob(json.dumps(config, sort_keys=True).encode())
        manifest = {"schemaVersion": 2, "mediaType": MEDIA_MANIFEST,
                    "config": {"mediaType": MEDIA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
                    "layers": [{"mediaType": MEDIA_LAYER, "digest": d, "size": os.path.getsize(p)}
                               for d, p in zip(ids, im.layers)]}
        manifest_digest, manifest_bytes = _blob(json.dumps(manifest, sort_keys=True).encode())
        blobs[config_digest], blobs[manifest_digest] = config_bytes, manifest_bytes
        manifests.append({"mediaType": MEDIA_MANIFEST, "digest": manifest_digest, "size": len(manifest_bytes),
                          "annotations": {"io.containerd.image.name": im.name,
                                          "org.opencontainers.image.ref.name": im.name}})
    return {"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": manifests}, blobs, layer_files


def write_layered_archive(images: Sequence[LayeredImage], path: str,
                          digests: Mapping[str, str] | None = None) -> str:
    """One OCI image layout tarball holding every image of ``images`` under its name (``ctr images
    import`` imports them all); a layer several images share is stored once.  ``digests``: layer
    file -> digest when known (else computed).  Written atomically; returns ``path``."""
    known = dict(digests or {})
    for im in images:
        for p in im.layers:
            if p not in known:
                known[p] = file_digest(p)
    index, blobs, layer_files = layered_index(images, known)
    tmp = f"{path}.tmp"
    with tarfile.open(tmp, mode="w") as tar:
        add = _start_layout(tar, index)
        for digest in sorted(layer_files):
            info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
            info.size, info.mode, info.mtime = os.path.getsize(layer_files[digest]), 0o644, 0
            with open(layer_files[digest], "rb") as f:
                tar.addfile(info, f)
        for digest in sorted(blobs):
            add("blobs/sha256/" + digest.split(":", 1)[1], blobs[digest])
    os.replace(tmp, path)
    return path


def archive_names(path: str) -> set[str]:
    """The image names an OCI archive's ``index.json`` gives (containerd's annotation, else the
    OCI ref name), as ``ctr images ls -q`` lists them once imported."""
    with tarfile.open(path) as tar:
        member = tar.extractfile("index.json")
        index = json.loads(member.read()) if member else {}
    out = set()
    for m in index.get("manifests", []):
        ann = m.get("annotations") or {}
        name = ann.get("io.containerd.image.name") or ann.get("org.opencontainers.image.ref.name")
        if name:
            out.add(name)
    return out
