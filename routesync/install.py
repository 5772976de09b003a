"""``ferry-route-sync install-cni``: put the frozen bundle, the CNI links and the conflist on a host.

What it does (plan as data, then apply; every step idempotent):

* copies the bundle (``--bundle-dir``, or the one this executable runs from when frozen) to
  ``<cni-bin-dir>/.ferry-bundle/<digest>/`` (digest of the bundle's files: an unchanged bundle
  is not copied again, a new one lands beside the old: copied under a temp name, each file
  fsync'ed, then the directory renamed into place, so a copy under its digest is always whole);
* links ``ferry`` and ``ferry-ipam`` in the CNI bin dir with *relative* symlinks (the init
  container sees the host's bin dir under another path), each replaced by rename: an exec of
  ``<bin>/ferry`` resolves to one whole copy, old or new.  PyInstaller's onedir bootloader reads
  its own path from ``/proc/self/exe`` (the copy's real path, the symlink resolved), finds
  ``_internal`` beside it, re-execs itself by that path and imports the plugin's modules from
  there as it runs: a call that started on the old copy keeps reading the old copy's files;
* keeps the copy the links pointed to before a switch (a call that exec'd the old entry point a
  moment ago still re-execs and imports from it) and removes the copies older than that: at most
  two on disk, the linked one and the one before it.  A run that switches nothing removes no copy;
* writes ``<cni-conf-dir>/10-ferry.conflist`` atomically (temp file + fsync + rename) from the
  templates in ``conflist/``: ``ferry`` with its IPAM, then ``portmap`` and ``bandwidth`` when they
  are in the bin dir and support the chosen ``cniVersion`` (asked with CNI VERSION);
* the ``cniVersion`` (``--cni-version auto``, the default) is the highest one the Node's container
  runtime reads (``routesync/runtimes.py``: runtime release -> libcni -> result versions), among
  those the chained plugins present also support; the runtime is named by ``--runtime-version``,
  else read from this Node's object (``status.nodeInfo.containerRuntimeVersion``; ``--node-name``
  or ``$NODE_NAME``, in-cluster credentials or ``--kubeconfig``), else asked on this host
  (``containerd``/``crio``/``podman --version``: every one found), else unknown (1.0.0). An
  explicit ``--cni-version`` above what a known runtime reads is refused unless ``--force``: the
  runtime would refuse every Pod's result;
* removes stale Ferry confs (any other conf in the conf dir whose plugins include ``ferry``);
* networkPolicyOnly (``--config``: route-sync's config, whose ``trafficEncapMode`` says so): Ferry
  runs chained after the Node's primary CNI.  The primary's conf is the first non-Ferry one in
  the conf dir in libcni's order; install-cni writes ``00-ferry-chained.conflist``, the primary's
  plugins (its name and cniVersion) with ``ferry`` appended and no IPAM of Ferry's, then
  ``portmap``/``bandwidth`` as above when the primary has none of its own, so the runtime loads
  it first and hostPort works as with Ferry's own conflist.  No primary conf yet: an error (the
  init container is retried), never a Ferry conf without it.

``--uninstall`` removes exactly what an install writes: the conflist (when it is ours), the two
links (when they point into the bundle dir) and the bundle dir."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cni.node.atomicfile import write_atomic as write_bytes

from . import runtimes

CONFLIST_NAME = "10-ferry.conflist"
CHAINED_CONFLIST_NAME = "00-ferry-chained.conflist"  # networkPolicyOnly: sorts before the primary's
NETWORK_NAME = "ferry"
BUNDLE_DIR_NAME = ".ferry-bundle"
BUNDLE_LOCK = ".lock"  # in the bundle dir: one install-cni at a time on a host
LINKED = ("ferry", "ferry-ipam")
CHAINED = ("portmap", "bandwidth")
CNI_VERSIONS = ("1.1.0", "1.0.0", "0.4.0")  # what install-cni writes, newest first
SUPPORTED_CNI_VERSIONS = ("1.1.0", "1.0.0", "0.4.0", "0.3.1", "0.3.0")  # a primary's Ferry can follow
AUTO = "auto"
DEFAULT_CNI_VERSION = AUTO
CONF_SUFFIXES = (".conf", ".conflist", ".json")  # what libcni loads from a conf dir


class InstallError(Exception):
    """The install cannot proceed (no bundle, bad template, bad override); the message says why."""


# --- templates and rendering (pure) ------------------------------------------------------------

def templates_dir() -> str:
    """``conflist/`` of the frozen bundle (``_internal/conflist``) or of the source tree."""
    base = getattr(sys, "_MEIPASS", None)
    if base:
        return os.path.join(base, "conflist")
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conflist")


def load_templates(directory: str | None = None) -> dict[str, dict[str, Any]]:
    d = directory or templates_dir()
    out: dict[str, dict[str, Any]] = {}
    for name in ("ferry", *CHAINED):
        path = os.path.join(d, f"{name}.json")
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise InstallError(f"conflist template {path}: {e}") from None
        if not isinstance(doc, dict) or doc.get("type") != name:
            raise InstallError(f"conflist template {path}: expected an object with type {name!r}")
        out[name] = doc
    return out


def merge_ferry(template: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The ferry entry: ``overrides`` replace top-level keys; ``ipam`` is merged one level deep."""
    conf = json.loads(json.dumps(template))
    for k, v in overrides.items():
        if k == "type":
            raise InstallError("--ferry-conf may not change the plugin type")
        if k == "ipam" and isinstance(v, dict) and isinstance(conf.get("ipam"), dict):
            conf["ipam"] = {**conf["ipam"], **v}
        else:
            conf[k] = v
    return conf


def render_conflist(templates: dict[str, dict[str, Any]], cni_version: str, chained: Iterable[str],
                    overrides: dict[str, Any] | None = None, name: str = NETWORK_NAME) -> dict[str, Any]:
    if cni_version not in CNI_VERSIONS:
        raise InstallError(f"cniVersion {cni_version!r} is not one of {', '.join(CNI_VERSIONS)}")
    plugins = [merge_ferry(templates["ferry"], overrides or {})]
    plugins += [json.loads(json.dumps(templates[p])) for p in CHAINED if p in set(chained)]
    return {"cniVersion": cni_version, "name": name, "plugins": plugins}


def primary_conf(conf_dir: str) -> tuple[str, dict[str, Any]] | None:
    """The primary CNI's conf: the first one libcni would load (file names sorted) that is not
    Ferry's; None when there is none."""
    for _fn, path, doc in conf_docs(conf_dir):
        if isinstance(doc, dict) and not is_ferry_conf(doc) and (doc.get("type") or doc.get("plugins")):
            return path, doc
    return None


def conf_docs(conf_dir: str) -> Iterator[tuple[str, str, Any]]:
    """Each CNI conf file of ``conf_dir`` as (file name, path, its JSON), in the order libcni reads
    them (names sorted); a file that cannot be read or parsed is passed over."""
    try:
        names = sorted(os.listdir(conf_dir))
    except FileNotFoundError:
        return
    for fn in names:
        path = os.path.join(conf_dir, fn)
        if not fn.endswith(CONF_SUFFIXES) or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        yield fn, path, doc


def render_chained(templates: dict[str, dict[str, Any]], primary: tuple[str, dict[str, Any]],
                   overrides: dict[str, Any] | None = None, chained: Iterable[str] = ()) -> dict[str, Any]:
    """networkPolicyOnly: the primary's plugins (a conflist's, or a single ``.conf``'s) with the
    ferry entry appended, without Ferry's IPAM (the primary's owns the addresses), then those of
    ``chained`` (portmap, bandwidth) the primary does not run itself: hostPort and the bandwidth
    annotations work as with Ferry's own conflist."""
    path, doc = primary
    version = doc.get("cniVersion")
    if version not in SUPPORTED_CNI_VERSIONS:
        raise InstallError(f"primary CNI conf {path}: cniVersion {version!r} is not one Ferry answers in "
                           f"({', '.join(SUPPORTED_CNI_VERSIONS)})")
    if "plugins" in doc:
        plugins = doc["plugins"]
        if not isinstance(plugins, list) or not all(isinstance(p, dict) and p.get("type") for p in plugins):
            raise InstallError(f"primary CNI conf {path}: plugins must be a list of objects with a type")
        plugins = json.loads(json.dumps(plugins))
    else:
        plugins = [{k: v for k, v in doc.items() if k not in ("cniVersion", "name")}]
    ferry = merge_ferry(templates["ferry"], overrides or {})
    ferry.pop("ipam", None)
    have = {p["type"] for p in plugins}
    more = [json.loads(json.dumps(templates[p])) for p in CHAINED if p in set(chained) and p not in have]
    return {"cniVersion": version, "name": doc.get("name") or NETWORK_NAME, "plugins": [*plugins, ferry, *more]}


def chained_mode(config_path: str | None) -> bool:
    """route-sync's config at ``config_path`` says networkPolicyOnly (no path: not chained)."""
    if not config_path:
        return False
    from cni.pipeline.modes import NETWORK_POLICY_ONLY

    from .config import ConfigError, load

    try:
        return load(config_path).mode == NETWORK_POLICY_ONLY
    except (ConfigError, OSError) as e:
        raise InstallError(f"--config {config_path}: {e}") from None


def conflist_text(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2) + "\n"


def is_ferry_conf(doc: Any) -> bool:
    """A conf (``.conf``: one plugin) or conflist whose plugins include ``ferry``."""
    if not isinstance(doc, dict):
        return False
    if doc.get("type") == "ferry":
        return True
    plugins = doc.get("plugins")
    return isinstance(plugins, list) and any(isinstance(p, dict) and p.get("type") == "ferry" for p in plugins)


# --- bundle identity ---------------------------------------------------------------------------

def bundle_digest(bundle: str) -> str:
    """sha256 over every file's relative path, mode bit x and content (symlinks by target)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(bundle):
        dirnames.sort()
        for fn in sorted(filenames):
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, bundle)
            h.update(rel.encode() + b"\0")
            if os.path.islink(path):
                h.update(b"L" + os.readlink(path).encode() + b"\0")
                continue
            h.update(b"x" if os.access(path, os.X_OK) else b"-")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]


def running_bundle() -> str | None:
    """The onedir bundle this process runs from, when frozen."""
    if getattr(sys, "frozen", False):
        return os.path.dirname(os.path.realpath(sys.executable))
    return None


def check_bundle(bundle: str) -> None:
    for name in LINKED:
        if not os.access(os.path.join(bundle, name), os.X_OK):
            raise InstallError(f"{bundle} is not a Ferry bundle: no executable {name!r} (build it with `make dist`)")


# --- chained plugins ---------------------------------------------------------------------------

def supported_versions(plugin: str, timeout: float = 5.0) -> tuple[str, ...]:
    """CNI VERSION of an executable plugin; () when it does not answer."""
    env = {"CNI_COMMAND": "VERSION", "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    try:
        p = subprocess.run([plugin], input=b"{}", env=env, capture_output=True, timeout=timeout, check=False)
        doc = json.loads(p.stdout or b"{}")
    except (OSError, subprocess.SubprocessError, ValueError):
        return ()
    versions = doc.get("supportedVersions") if isinstance(doc, dict) else None
    return tuple(v for v in versions if isinstance(v, str)) if isinstance(versions, list) else ()


def chained_present(cni_bin_dir: str,
                    versions_of: Callable[[str], tuple[str, ...]] = supported_versions) -> dict[str, tuple[str, ...]]:
    """The chained plugins in the bin dir, each with the versions it says it supports."""
    out = {}
    for name in CHAINED:
        path = os.path.join(cni_bin_dir, name)
        if os.access(path, os.X_OK):
            out[name] = versions_of(path)
    return out


def chainable(cni_bin_dir: str, cni_version: str,
              versions_of: Callable[[str], tuple[str, ...]] = supported_versions) -> tuple[list[str], list[str]]:
    """(plugins to chain, notes on those left out)."""
    chained, notes = [], []
    for name, vs in chained_present(cni_bin_dir, versions_of).items():
        if cni_version in vs:
            chained.append(name)
        else:
            notes.append(f"{name} in {cni_bin_dir} does not support cniVersion {cni_version} "
                         f"(supports {', '.join(vs) or 'nothing it would say'}): not chained")
    return chained, notes


# --- which cniVersion --------------------------------------------------------------------------

@dataclass(frozen=True)
class Runtime:
    """A container runtime that will read the conflist, and how we know of it."""

    reading: runtimes.Reading
    origin: str  # "--runtime-version", "Node n1 status.nodeInfo.containerRuntimeVersion", ...

    def __str__(self) -> str:
        return f"{self.reading.note}; runtime from {self.origin}"


def node_runtime_version(node: dict[str, Any]) -> str:
    """``status.nodeInfo.containerRuntimeVersion`` of a Node object ("" when absent)."""
    info = ((node.get("status") or {}).get("nodeInfo") or {}) if isinstance(node, dict) else {}
    value = info.get("containerRuntimeVersion") if isinstance(info, dict) else None
    return value if isinstance(value, str) else ""


def in_cluster(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


def find_runtimes(runtime_version: str | None, node_name: str | None, kubeconfig: str | None,
                  log: Callable[[str], None] = print,
                  read_node: Callable[[str | None, str], dict[str, Any]] | None = None,
                  local: Callable[[], list[tuple[runtimes.RuntimeVersion, str]]] = runtimes.local_runtimes,
                  environ: dict[str, str] | None = None) -> list[Runtime]:
    """The runtimes the conflist is for, from the first source that names one: ``--runtime-version``,
    this Node's object (when a Node name and credentials are there), the runtimes on this host.
    [] when none does."""
    if runtime_version:
        try:
            rv = runtimes.parse_runtime_version(runtime_version)
        except ValueError as e:
            raise InstallError(f"--runtime-version: {e}") from None
        return [Runtime(runtimes.reading(rv), "--runtime-version")]
    if node_name and (kubeconfig or in_cluster(environ)):
        origin = f"Node {node_name} status.nodeInfo.containerRuntimeVersion"
        try:
            if read_node is None:
                from .sources import kube

                read_node = kube.read_node
            text = node_runtime_version(read_node(kubeconfig, node_name))
        except Exception as e:  # noqa: BLE001 - any failure to ask the API: say so, look further
            log(f"note: cannot read Node {node_name} from the Kubernetes API ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:200]}); asking the runtimes on this host")
        else:
            try:
                return [Runtime(runtimes.reading(runtimes.parse_runtime_version(text)), origin)]
            except ValueError as e:
                log(f"note: {origin}: {e}; asking the runtimes on this host")
    elif node_name:
        log(f"note: --node-name {node_name} but no Kubernetes credentials (not in a cluster, no "
            "--kubeconfig): asking the runtimes on this host")
    return [Runtime(runtimes.reading(rv), origin) for rv, origin in local()]


def resolve_cni_version(requested: str, found: list[Runtime], present: dict[str, tuple[str, ...]],
                        force: bool = False) -> tuple[str, list[str]]:
    """(the cniVersion to write, notes that say why).

    ``auto``: the highest of :data:`CNI_VERSIONS` that every runtime in ``found`` reads (1.0.0 when
    ``found`` is empty), preferring one that every chained plugin in ``present`` supports too (a
    plugin left out costs its capability: hostPort, bandwidth; a lower version costs only what
    needs 1.1). An explicit version is written as asked, unless a known runtime reads less:
    :class:`InstallError` naming the flag, or with ``force`` a note."""
    known = [r for r in found if r.reading.known]
    ceiling = min((r.reading.reads for r in found), key=runtimes.version_tuple, default=runtimes.FALLBACK)
    notes = [f"{r}" for r in found]
    if not found:
        notes.append(f"no container runtime named (--runtime-version), found on the Node object or on "
                     f"this host: assuming it reads results up to {runtimes.FALLBACK}")
    if requested != AUTO:
        if requested not in CNI_VERSIONS:
            raise InstallError(f"--cni-version {requested!r} is not one of {AUTO}, {', '.join(CNI_VERSIONS)}")
        below = [r for r in known if runtimes.version_tuple(r.reading.reads) < runtimes.version_tuple(requested)]
        if below and not force:
            r = below[0]
            row = r.reading.row
            assert row is not None  # known
            raise InstallError(
                f"--cni-version {requested}: {r.reading.runtime} (from {r.origin}) reads CNI results only "
                f"up to {r.reading.reads} (libcni {row.libcni}, per the go.mod of {row.source}) and would "
                f"refuse every Pod's result. Use --cni-version {AUTO} (or {r.reading.reads}), or --force "
                f"to write {requested} anyway")
        if below:
            notes.append(f"--force: writing cniVersion {requested} although {below[0].reading.runtime} "
                         f"reads only up to {below[0].reading.reads}")
        return requested, notes + below_1_1(requested)
    readable = [v for v in CNI_VERSIONS if runtimes.version_tuple(v) <= runtimes.version_tuple(ceiling)]
    if not readable:
        raise InstallError(f"--cni-version {AUTO}: the runtime reads CNI results only up to {ceiling}, below "
                           f"every version install-cni writes ({', '.join(CNI_VERSIONS)})")
    full = [v for v in readable if all(v in vs for vs in present.values())]
    version = (full or readable)[0]
    who = " and ".join(str(r.reading.runtime) for r in found) or "an unknown runtime"
    why = f"cniVersion {version} ({AUTO}): the highest {who} read{'s' if len(found) < 2 else ''}"
    if version != readable[0]:
        lacking = sorted(n for n, vs in present.items() if readable[0] not in vs)
        why += f" that {', '.join(lacking)} also support{'s' if len(lacking) == 1 else ''}"
    notes.append(why)
    return version, notes + below_1_1(version)


def below_1_1(version: str) -> list[str]:
    if runtimes.version_tuple(version) >= (1, 1, 0):
        return []
    return [(f"cniVersion {version} is below 1.1.0: results carry no interface or route MTU, and the "
             "runtime calls neither STATUS nor GC")]


# --- the plan ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class InstallPlan:
    bundle_src: str
    bundle_dest: str  # <bin>/.ferry-bundle/<digest>
    links: tuple[tuple[str, str], ...]  # (link path, relative target)
    conflist_path: str
    conflist_text: str
    remove: tuple[str, ...] = ()  # stale confs and older bundle copies
    notes: tuple[str, ...] = field(default=())


def stale_confs(conf_dir: str, keep: str) -> list[str]:
    return [path for fn, path, doc in conf_docs(conf_dir) if fn != keep and is_ferry_conf(doc)]


def plan_install(bundle: str, cni_bin_dir: str, cni_conf_dir: str, cni_version: str = runtimes.FALLBACK,
                 overrides: dict[str, Any] | None = None, templates: dict[str, dict[str, Any]] | None = None,
                 versions_of: Callable[[str], tuple[str, ...]] = supported_versions,
                 chained_after_primary: bool = False) -> InstallPlan:
    check_bundle(bundle)
    digest = bundle_digest(bundle)
    root = os.path.join(cni_bin_dir, BUNDLE_DIR_NAME)
    dest = os.path.join(root, digest)
    links = tuple((os.path.join(cni_bin_dir, n), os.path.join(BUNDLE_DIR_NAME, digest, n)) for n in LINKED)
    if chained_after_primary:
        primary = primary_conf(cni_conf_dir)
        if primary is None:
            raise InstallError(f"networkPolicyOnly: no primary CNI conf in {cni_conf_dir} to chain Ferry after "
                               "(install the primary CNI first)")
        chained, notes = chainable(cni_bin_dir, str(primary[1].get("cniVersion")), versions_of)
        doc = render_chained(templates or load_templates(), primary, overrides, chained)
        name = CHAINED_CONFLIST_NAME
        notes.insert(0, f"networkPolicyOnly: chained after {primary[0]}")
    else:
        chained, notes = chainable(cni_bin_dir, cni_version, versions_of)
        doc = render_conflist(templates or load_templates(), cni_version, chained, overrides)
        name = CONFLIST_NAME
    copies = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) \
        if os.path.isdir(root) else []
    old_bundles = [os.path.join(root, d) for d in stale_copies(copies, digest, linked_copies(cni_bin_dir))]
    return InstallPlan(bundle, dest, links, os.path.join(cni_conf_dir, name), conflist_text(doc),
                       tuple(stale_confs(cni_conf_dir, name) + old_bundles), tuple(notes))


def linked_copies(cni_bin_dir: str) -> set[str]:
    """The bundle copies (digests) the entry points in the bin dir link into now."""
    out = set()
    for name in LINKED:
        try:
            target = os.readlink(os.path.join(cni_bin_dir, name))
        except OSError:  # absent, or not a link
            continue
        parts = target.split(os.sep)
        if len(parts) == 3 and parts[0] == BUNDLE_DIR_NAME and parts[2] == name:
            out.add(parts[1])
    return out


def stale_copies(copies: Iterable[str], digest: str, linked: set[str]) -> list[str]:
    """Which entries of the bundle dir go, installing ``digest`` while the links point into ``linked``.

    A copy's temp dir (never linked: an install that died) always goes.  Switching to ``digest``:
    every copy but ``digest`` and those linked until now (the calls that exec'd the old entry
    points a moment ago read their files still).  Not switching (``linked`` is ``digest``): no
    copy goes, so the one before stays until the next switch: never more than two are kept."""
    switching = linked != {digest}
    keep = {digest, *linked}
    return [c for c in copies if not is_copy_name(c) or (switching and c not in keep)]


def is_copy_name(name: str) -> bool:
    """A copy's name (a 16 hex digit digest), as opposed to a temp dir's."""
    return len(name) == 16 and all(ch in "0123456789abcdef" for ch in name)


# --- applying ----------------------------------------------------------------------------------

def write_atomic(path: str, text: str, mode: int = 0o644) -> bool:
    """Write ``text`` to ``path`` by rename; False (nothing written) when it holds it already."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except (OSError, UnicodeDecodeError):
        pass
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_bytes(path, text.encode("utf-8"), mode)  # its temp name ends in .tmp: libcni skips it
    return True


def link_atomic(path: str, target: str) -> bool:
    if os.path.islink(path) and os.readlink(path) == target:
        return False
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp{os.getpid()}")
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, path)
    return True


def copy_synced(src: str, dst: str) -> str:
    """shutil.copy2, then fsync: a copy renamed into place survives a power cut whole."""
    shutil.copy2(src, dst)
    fd = os.open(dst, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return dst


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_bundle(src: str, dest: str) -> bool:
    """Copy ``src`` to ``dest`` unless it is there: under a temp name, then one rename, so
    ``dest`` is whole or absent (an exec through a link into it never sees half a bundle)."""
    if os.path.isdir(dest):
        return False
    tmp = f"{dest}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, symlinks=True, copy_function=copy_synced)
    for dirpath, _dirs, _files in os.walk(tmp):
        fsync_dir(dirpath)
    os.rename(tmp, dest)
    fsync_dir(os.path.dirname(dest))
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def apply_install(plan: InstallPlan) -> list[str]:
    """Apply ``plan``; returns what changed (empty: the host held it already)."""
    changed = []
    os.makedirs(os.path.dirname(plan.bundle_dest), exist_ok=True)
    if copy_bundle(plan.bundle_src, plan.bundle_dest):
        changed.append(f"copied {plan.bundle_src} to {plan.bundle_dest}")
    for path, target in plan.links:
        if link_atomic(path, target):
            changed.append(f"linked {path} -> {target}")
    if write_atomic(plan.conflist_path, plan.conflist_text):
        changed.append(f"wrote {plan.conflist_path}")
    for path in plan.remove:  # after the switch; never the copy linked until now (stale_copies)
        _remove(path)
        changed.append(f"removed {path}")
    return changed


def uninstall(cni_bin_dir: str, cni_conf_dir: str) -> list[str]:
    removed = []
    conf = os.path.join(cni_conf_dir, CONFLIST_NAME)
    for path in [conf, *stale_confs(cni_conf_dir, CONFLIST_NAME)]:
        try:
            with open(path, encoding="utf-8") as f:
                ours = is_ferry_conf(json.load(f))
        except (OSError, ValueError):
            continue
        if ours:
            os.unlink(path)
            removed.append(path)
    for name in LINKED:
        path = os.path.join(cni_bin_dir, name)
        if os.path.islink(path) and os.readlink(path).startswith(BUNDLE_DIR_NAME + os.sep):
            os.unlink(path)
            removed.append(path)
    root = os.path.join(cni_bin_dir, BUNDLE_DIR_NAME)
    if os.path.isdir(root):
        shutil.rmtree(root)
        removed.append(root)
    return removed


@contextlib.contextmanager
def install_lock(cni_bin_dir: str) -> Iterator[None]:
    """Held while one install-cni plans and applies (an init container restarted while the one
    before still copies would otherwise remove its temp dir, or switch the links under it)."""
    root = os.path.join(cni_bin_dir, BUNDLE_DIR_NAME)
    os.makedirs(root, exist_ok=True)
    fd = os.open(os.path.join(root, BUNDLE_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_overrides(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise InstallError(f"--ferry-conf {path}: {e}") from None
    if not isinstance(doc, dict):
        raise InstallError(f"--ferry-conf {path}: expected a JSON object")
    return doc


def install_cni(cni_bin_dir: str, cni_conf_dir: str, bundle_dir: str | None = None,
                cni_version: str = DEFAULT_CNI_VERSION, ferry_conf: str | None = None,
                do_uninstall: bool = False, log: Callable[[str], None] = print, *,
                runtime_version: str | None = None, node_name: str | None = None,
                kubeconfig: str | None = None, force: bool = False, config_path: str | None = None,
                versions_of: Callable[[str], tuple[str, ...]] = supported_versions,
                local: Callable[[], list[tuple[runtimes.RuntimeVersion, str]]] = runtimes.local_runtimes) -> int:
    """The command: 0 on success; :class:`InstallError` when it cannot proceed."""
    if do_uninstall:
        removed = uninstall(cni_bin_dir, cni_conf_dir)
        for r in removed:
            log(f"removed {r}")
        log("ferry uninstalled" if removed else "nothing of ferry installed")
        return 0
    bundle = bundle_dir or running_bundle()
    if bundle is None:
        raise InstallError("not running from a frozen bundle: give --bundle-dir (see `make dist`)")
    overrides = load_overrides(ferry_conf)
    versions_of = functools.cache(versions_of)  # the choice and the plan ask the same plugins
    chained = chained_mode(config_path)
    version = runtimes.FALLBACK
    if not chained:  # chained: the primary's cniVersion, which the runtime reads already
        found = find_runtimes(runtime_version, node_name, kubeconfig, log, local=local)
        version, why = resolve_cni_version(cni_version, found, chained_present(cni_bin_dir, versions_of), force)
        for line in why:
            log(f"note: {line}")
    with install_lock(cni_bin_dir):  # the links read by the plan are the ones the apply replaces
        plan = plan_install(os.path.realpath(bundle), cni_bin_dir, cni_conf_dir, version, overrides,
                            versions_of=versions_of, chained_after_primary=chained)
        for note in plan.notes:
            log(f"note: {note}")
        changed = apply_install(plan)
    for c in changed:
        log(c)
    log(f"ferry installed ({'changed' if changed else 'unchanged'}): {plan.conflist_path}")
    return 0


def click_command() -> Any:
    """The ``install-cni`` click command (``routesync.cli`` adds it to its group)."""
    import click

    @click.command("install-cni")
    @click.option("--cni-bin-dir", default="/opt/cni/bin", show_default=True, help="where CNI plugins live")
    @click.option("--cni-conf-dir", default="/etc/cni/net.d", show_default=True, help="where conflists live")
    @click.option("--bundle-dir", default=None,
                  help="the onedir bundle to install (default: the one this executable runs from)")
    @click.option("--cni-version", type=click.Choice((AUTO, *CNI_VERSIONS)), default=DEFAULT_CNI_VERSION,
                  show_default=True,
                  help="cniVersion of the conflist; auto: the highest the Node's container runtime reads")
    @click.option("--runtime-version", default=None, metavar="NAME://VERSION",
                  help="the container runtime that reads the conflist, as a Node reports it "
                       "(containerd://1.7.24, cri-o://1.30.4, podman://4.3.1); default: this Node's "
                       "status.nodeInfo.containerRuntimeVersion, else the runtimes on this host")
    @click.option("--node-name", envvar="NODE_NAME", default=None, show_envvar=True,
                  help="this Node's name, to read its runtime version from the Kubernetes API")
    @click.option("--kubeconfig", default=None,
                  help="credentials for the Kubernetes API (default: in-cluster service account)")
    @click.option("--force", is_flag=True,
                  help="write an explicit --cni-version even when the runtime is known to read less")
    @click.option("--ferry-conf", default=None,
                  help="JSON object overriding keys of the ferry entry (ipam merged one level deep)")
    @click.option("--uninstall", is_flag=True, help="remove what install-cni wrote")
    @click.option("--config", "config_path", default=None, metavar="PATH",
                  help="route-sync's config: with trafficEncapMode networkPolicyOnly, Ferry is chained after "
                       "the primary CNI's conf (00-ferry-chained.conflist)")
    def install_cni_cmd(cni_bin_dir: str, cni_conf_dir: str, bundle_dir: str | None, cni_version: str,
                        runtime_version: str | None, node_name: str | None, kubeconfig: str | None,
                        force: bool, ferry_conf: str | None, uninstall: bool, config_path: str | None) -> None:
        """Copy the bundle, link ferry/ferry-ipam into the CNI bin dir, write 10-ferry.conflist
        (networkPolicyOnly: 00-ferry-chained.conflist, after the primary CNI)."""
        try:
            install_cni(cni_bin_dir, cni_conf_dir, bundle_dir, cni_version, ferry_conf, uninstall,
                        log=click.echo, runtime_version=runtime_version, node_name=node_name,
                        kubeconfig=kubeconfig, force=force, config_path=config_path)
        except (InstallError, OSError) as e:
            raise click.ClickException(str(e)) from None

    return install_cni_cmd
