"""The embedded Node registry: a directory shared by the Nodes, one ``<name>.yaml`` per Node.

    name: node-a
    transportAddresses: [192.168.77.11, "fd00:77::11"]
    podCIDRs: [10.244.1.0/24, "fd00:10:244:1::/64"]
    annotations: {ferry.io/mac-address: "02:00:00:00:00:01"}

Each route-sync writes only its own file, atomically (temp file, fsync, rename, fsync of the
directory), so a reader sees the old or the new record, never half of one.  Changes are found
by polling the directory's entries (name, mtime_ns, size, inode) every ``poll_interval``
(default 100 ms): an ``os.scandir`` of a few hundred entries costs well under a millisecond, and
polling works on any filesystem the Nodes might share (inotify does not see writes from other
machines on NFS).  A file is re-parsed only when its entry changed.  A malformed record is
logged once and skipped; the others still count."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from ..model import NodeRecord
from .base import NodeSource, validate_record

log = logging.getLogger(__name__)

SUFFIX = ".yaml"

Signature = tuple[int, int, int]  # mtime_ns, size, inode


@dataclass
class _Entry:
    sig: Signature
    record: NodeRecord | None  # None: malformed


def parse_record(text: str, expected_name: str) -> NodeRecord:
    """Parse one record file; ValueError says what is wrong."""
    import yaml

    try:
        d = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # the C safe loader: 5x faster
    except yaml.YAMLError as e:
        raise ValueError(f"not valid YAML ({e})") from None
    if not isinstance(d, dict):
        raise ValueError("not a mapping")  # noqa: TRY004
    unknown = set(d) - {"name", "transportAddresses", "podCIDRs", "annotations"}
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    name = d.get("name")
    if name != expected_name:
        raise ValueError(f"name {name!r} does not match the file name ({expected_name!r})")
    addrs = d.get("transportAddresses") or []
    cidrs = d.get("podCIDRs") or []
    ann = d.get("annotations") or {}
    if not isinstance(addrs, list) or not isinstance(cidrs, list) or not isinstance(ann, dict):
        raise ValueError("transportAddresses/podCIDRs must be lists, annotations a mapping")  # noqa: TRY004
    return validate_record(NodeRecord(
        name=name,
        transport_addresses=tuple(str(a) for a in addrs),
        pod_cidrs=tuple(str(c) for c in cidrs),
        annotations=tuple((str(k), str(v)) for k, v in ann.items()),
    ))


def render_record(rec: NodeRecord) -> str:
    import yaml

    return yaml.safe_dump({
        "name": rec.name,
        "transportAddresses": list(rec.transport_addresses),
        "podCIDRs": list(rec.pod_cidrs),
        "annotations": dict(rec.annotations),
    }, sort_keys=True, default_flow_style=False)


def write_atomic(path: str, text: str) -> None:
    from cni.node.atomicfile import write_atomic as write_bytes

    write_bytes(path, text.encode("utf-8"))


class RegistrySource(NodeSource):
    def __init__(self, directory: str, node_name: str, poll_interval: float = 0.1) -> None:
        self.directory = directory
        self.node_name = node_name
        self.poll_interval = poll_interval
        self._entries: dict[str, _Entry] = {}
        self._listed: dict[str, Signature] | None = None  # the scan the last list() returned
        os.makedirs(directory, mode=0o755, exist_ok=True)

    # -- scanning ----------------------------------------------------------------------------
    def _scan(self) -> dict[str, Signature]:
        sigs: dict[str, Signature] = {}
        with os.scandir(self.directory) as it:
            for e in it:
                if e.name.startswith(".") or not e.name.endswith(SUFFIX):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                sigs[e.name[: -len(SUFFIX)]] = (st.st_mtime_ns, st.st_size, st.st_ino)
        return sigs

    def _refresh(self, sigs: dict[str, Signature]) -> None:
        for name in list(self._entries):
            if name not in sigs:
                del self._entries[name]
        for name, sig in sigs.items():
            old = self._entries.get(name)
            if old is not None and old.sig == sig:
                continue
            path = os.path.join(self.directory, name + SUFFIX)
            try:
                with open(path, encoding="utf-8") as f:
                    record: NodeRecord | None = parse_record(f.read(), name)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, UnicodeDecodeError) as e:
                log.warning("registry: skipping malformed record %s: %s", path, e)
                record = None
            self._entries[name] = _Entry(sig, record)

    # -- NodeSource ---------------------------------------------------------------------------
    def list(self) -> list[NodeRecord]:
        sigs = self._scan()
        self._refresh(sigs)
        self._listed = sigs
        return [e.record for _, e in sorted(self._entries.items()) if e.record is not None]

    def wait_for_change(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._listed is None or self._scan() != self._listed:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.poll_interval, left))

    def publish_self(self, record: NodeRecord) -> None:
        if record.name != self.node_name:
            raise ValueError(f"this source publishes {self.node_name!r} only, not {record.name!r}")
        text = render_record(validate_record(record))
        path = os.path.join(self.directory, record.name + SUFFIX)
        try:
            with open(path, encoding="utf-8") as f:
                if f.read() == text:
                    return
        except FileNotFoundError:
            pass
        write_atomic(path, text)
        if self._listed is not None:  # our own write is no news to us (we planned with it already)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return
            self._listed[record.name] = (st.st_mtime_ns, st.st_size, st.st_ino)

    def remove_self(self) -> None:
        """Delete this Node's record (teardown)."""
        try:
            os.unlink(os.path.join(self.directory, self.node_name + SUFFIX))
        except FileNotFoundError:
            pass
