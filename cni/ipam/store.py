"""The IPAM store on disk: one record per attachment, one claim per address, a redo journal.

Layout of a store directory (``<dataDir>/<network name>``)::

    lock                     flock(LOCK_EX) serializes every operation (readers too: they may replay)
    journal                  the operation in flight (JSON); absent when the store is at rest
    cursor.<i>               last address handed out from range set <i> (a hint: where to look next)
    ips/<address>            claim: "<container id>\\n<ifname>\\n"; its existence means "taken"
    attachments/<cid>:<if>   record: {"containerID", "ifname", "ips": [{"address", "gateway"}]}

Why a file per attachment *and* a file per address, rather than one file: ADD must answer "is
this address taken" and "does this attachment already have addresses" in O(1) (one ``lstat``,
one ``open``) however full the range is; a single file would be parsed and rewritten whole on
every ADD (65k records on a full /16).  DEL finds its addresses in the attachment's record
instead of scanning every claim (host-local scans).

Crash safety: a mutation first writes the journal (temp file, rename), then applies itself
idempotently (every file written as a temp file and renamed over), and removes the journal.
Whoever takes the lock next replays a journal it finds.  So a SIGKILL at any instant leaves the
old state (journal not yet in place) or, after replay, the new one; claims and records always
match one to one; no file is ever torn.

Power loss is a different contract, chosen per network with ``ipam.durable``: with it, every
file and directory is fsynced before the next step (write, fsync, rename, fsync dir), so a power
cut behaves like a SIGKILL.  Without it (the default, like host-local) the kernel's page cache
carries the store across process crashes but a power cut may lose the last operations.  The
Pods die with the Node anyway and the runtime's CNI GC releases what is left, and the seven
fsyncs cost ~30 ms of an ADD on a busy disk (measured; a third of the plugin's time).

Every path is opened relative to a directory descriptor with ``O_NOFOLLOW``; the store
directory must be a real directory owned by us and not writable by group/others, so a symlink
planted at a path we write is refused rather than followed."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from cni.lean import fastjson as json
from cni.lean.record import record
from cni.lean.typecheck import TYPE_CHECKING
from cni.node.atomicfile import write_atomic
from cni.spec.errors import IO_FAILURE, IPAM_FAILURE, CniError

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

Key = tuple[str, str]  # (container ID, ifname)

LOCK, JOURNAL, IPS, ATTACHMENTS = "lock", "journal", "ips", "attachments"
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@record(frozen=True)
class StoredIP:
    address: str  # CIDR: "10.244.1.5/24"
    gateway: str = ""

    @property
    def ip(self) -> str:
        return self.address.split("/", 1)[0]


@record(frozen=True)
class Record:
    container_id: str
    ifname: str
    ips: tuple[StoredIP, ...]

    @property
    def key(self) -> Key:
        return (self.container_id, self.ifname)

    def to_json(self) -> dict[str, Any]:
        return {"containerID": self.container_id, "ifname": self.ifname,
                "ips": [{"address": i.address, "gateway": i.gateway} for i in self.ips]}

    @staticmethod
    def from_json(d: Any) -> Record:
        if not isinstance(d, dict) or not isinstance(d.get("ips"), list):
            raise TypeError("record is not an object with an 'ips' list")
        return Record(str(d["containerID"]), str(d["ifname"]),
                      tuple(StoredIP(str(i["address"]), str(i.get("gateway", ""))) for i in d["ips"]))


def _escape(s: str) -> str:
    return "".join(c if c in _SAFE else "".join(f"%{b:02x}" for b in c.encode()) for c in s)


def _unescape(s: str) -> str:
    out = bytearray()
    i = 0
    while i < len(s):
        if s[i] == "%":
            out.append(int(s[i + 1:i + 3], 16))
            i += 3
        else:
            out += s[i].encode()
            i += 1
    return out.decode()


def record_name(key: Key) -> str:
    """``<cid>:<ifname>``, escaped: CNI container IDs and ifnames never contain ':'."""
    name = f"{_escape(key[0])}:{_escape(key[1])}"
    if len(name) > 240:
        raise CniError(IPAM_FAILURE, f"container ID/ifname too long for the store: {key[0]!r}/{key[1]!r}")
    return name


def key_of_name(name: str) -> Key:
    cid, _, ifname = name.partition(":")
    return (_unescape(cid), _unescape(ifname))


def claim_bytes(key: Key) -> bytes:
    return f"{key[0]}\n{key[1]}\n".encode()


# --- descriptor-relative file primitives -------------------------------------------------------

def _read(dir_fd: int, name: str) -> bytes | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write(dir_fd: int, name: str, data: bytes, sync: bool = True, sync_dir: bool = False) -> None:
    """Atomically replace ``name`` (:func:`cni.node.atomicfile.write_atomic`: a fresh temp file,
    never an existing one, so no planted link is followed or truncated; fsync when ``sync``; rename
    over).  The store's lock makes one fixed temp name per file safe (a crashed writer's leftover
    is reused, and swept by recovery); the directory is fsynced by the caller, once for several
    files, unless ``sync_dir``."""
    write_atomic(name, data, sync=sync, dir_fd=dir_fd, sync_dir=sync_dir, tmp_name=f".{name}.tmp")


def _unlink(dir_fd: int, name: str) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _open_dir(name: str, parent_fd: int | None) -> int:
    """Open (creating it 0755 if absent) a directory we own, refusing symlinks and loose modes."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CniError(IPAM_FAILURE, f"ipam store: {name} is not a directory (symlink?)") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise CniError(IPAM_FAILURE, f"ipam store: {name} must be owned by uid {os.geteuid()} and not "
                                     f"writable by group or others (mode {stat.filemode(st.st_mode)})")
    return fd


class Txn:
    """The store while its lock is held: reads, and journaled mutations."""

    def __init__(self, root_fd: int, ips_fd: int, att_fd: int, durable: bool = False) -> None:
        self.root_fd, self.ips_fd, self.att_fd = root_fd, ips_fd, att_fd
        self.durable = durable

    # reads
    def get(self, key: Key) -> Record | None:
        data = _read(self.att_fd, record_name(key))
        return None if data is None else Record.from_json(json.loads(data))

    def taken(self, addr_text: str) -> bool:
        return _exists(self.ips_fd, addr_text)

    def owner(self, addr_text: str) -> Key | None:
        data = _read(self.ips_fd, addr_text)
        if data is None:
            return None
        cid, _, rest = data.decode().partition("\n")
        return (cid, rest.rstrip("\n"))

    def cursor(self, index: int) -> str | None:
        data = _read(self.root_fd, f"cursor.{index}")
        return None if data is None else data.decode(errors="replace").strip()

    def keys(self) -> list[Key]:
        return [key_of_name(n) for n in sorted(os.listdir(self.att_fd)) if not n.startswith(".")]

    def records(self) -> Iterator[Record]:
        for n in sorted(os.listdir(self.att_fd)):
            if not n.startswith("."):
                data = _read(self.att_fd, n)
                if data is not None:
                    yield Record.from_json(json.loads(data))

    def claims(self) -> dict[str, Key | None]:
        return {n: self.owner(n) for n in sorted(os.listdir(self.ips_fd)) if not n.startswith(".")}

    # mutations
    def add(self, record: Record, cursors: dict[int, str]) -> None:
        self._journal({"op": "add", "record": record.to_json(), "cursors": {str(k): v for k, v in cursors.items()}})
        self._replay()

    def delete(self, record: Record) -> None:
        self._journal({"op": "del", "record": record.to_json()})
        self._replay()

    def _journal(self, entry: dict[str, Any]) -> None:
        _write(self.root_fd, JOURNAL, json.dumps(entry).encode(), sync=self.durable, sync_dir=self.durable)

    def _replay(self, recovering: bool = False) -> None:
        """Apply the journal if there is one (idempotent), make it durable, remove the journal.
        ``recovering``: the journal was left by a process that died; also sweep its temp files
        (a directory scan, paid only after a crash, never on the normal path)."""
        data = _read(self.root_fd, JOURNAL)
        if data is None:
            return
        try:
            entry = json.loads(data)
            record = Record.from_json(entry["record"])
        except (ValueError, KeyError, TypeError):
            # The journal is renamed into place only once complete, so this is not a torn write.
            raise CniError(IPAM_FAILURE, "ipam store: the journal is unreadable; refusing to guess") from None
        if recovering:
            for d in (self.ips_fd, self.att_fd):  # temp files of the interrupted apply
                for n in os.listdir(d):
                    if n.startswith("."):
                        _unlink(d, n)
        key = record.key
        if entry.get("op") == "add":
            for ip in record.ips:
                _write(self.ips_fd, ip.ip, claim_bytes(key), sync=self.durable)
            _write(self.att_fd, record_name(key), json.dumps(record.to_json()).encode(), sync=self.durable)
            for index, addr in (entry.get("cursors") or {}).items():
                _write(self.root_fd, f"cursor.{int(index)}", addr.encode(), sync=False)
        elif entry.get("op") == "del":
            for ip in record.ips:
                if self.owner(ip.ip) == key:
                    _unlink(self.ips_fd, ip.ip)
            _unlink(self.att_fd, record_name(key))
        else:
            raise CniError(IPAM_FAILURE, f"ipam store: unknown journal op {entry.get('op')!r}")
        if self.durable:
            os.fsync(self.ips_fd)
            os.fsync(self.att_fd)
        _unlink(self.root_fd, JOURNAL)

    def verify(self) -> list[str]:
        """Invariant check (tests, ``ferry-ipam ls --check``): every claim belongs to exactly one
        record that lists it, every record's addresses are claimed by it, nothing is torn."""
        problems: list[str] = []
        held: dict[str, Key] = {}
        for n in sorted(os.listdir(self.att_fd)):
            if n.startswith("."):
                problems.append(f"attachments/{n}: leftover temp file")
                continue
            try:
                rec = Record.from_json(json.loads(_read(self.att_fd, n) or b""))
            except (ValueError, KeyError, TypeError) as e:
                problems.append(f"attachments/{n}: unreadable ({e})")
                continue
            if record_name(rec.key) != n:
                problems.append(f"attachments/{n}: holds {rec.key}")
            for ip in rec.ips:
                if ip.ip in held:
                    problems.append(f"{ip.ip} held by {held[ip.ip]} and {rec.key}")
                held[ip.ip] = rec.key
        claims = set()
        for n in sorted(os.listdir(self.ips_fd)):
            if n.startswith("."):
                problems.append(f"ips/{n}: leftover temp file")
                continue
            claims.add(n)
            owner = self.owner(n)
            if held.get(n) != owner:
                problems.append(f"ips/{n}: claimed by {owner}, record says {held.get(n)}")
        for addr, key in held.items():
            if addr not in claims:
                problems.append(f"{addr}: in the record of {key} but not claimed")
        if _exists(self.root_fd, JOURNAL):
            problems.append("journal present while the lock is held")
        return problems


class Store:
    """``with Store(path).locked() as txn:`` — creates the store if needed, takes the lock,
    replays an interrupted operation, yields a :class:`Txn`."""

    def __init__(self, path: str, durable: bool = False) -> None:
        self.path = path
        self.durable = durable

    def locked(self) -> _Locked:
        return _Locked(self.path, self.durable)


class _Locked:
    def __init__(self, path: str, durable: bool = False) -> None:
        self.path = path
        self.durable = durable
        self.fds: list[int] = []

    def __enter__(self) -> Txn:
        try:
            os.makedirs(os.path.dirname(self.path) or ".", mode=0o755, exist_ok=True)
            root = _open_dir(self.path, None)
            self.fds.append(root)
            lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=root)
            self.fds.append(lock)
            fcntl.flock(lock, fcntl.LOCK_EX)
            ips = _open_dir(IPS, root)
            self.fds.append(ips)
            att = _open_dir(ATTACHMENTS, root)
            self.fds.append(att)
            txn = Txn(root, ips, att, self.durable)
            txn._replay(recovering=True)
            return txn
        except OSError as e:
            self._close()
            raise CniError(IO_FAILURE, f"ipam store {self.path}: {e.strerror or e}") from None
        except BaseException:
            self._close()
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        self._close()
        if isinstance(exc, OSError):
            raise CniError(IO_FAILURE, f"ipam store {self.path}: {exc.strerror or exc}") from exc

    def _close(self) -> None:
        for fd in reversed(self.fds):  # closing the lock descriptor releases the flock
            os.close(fd)
        self.fds.clear()
