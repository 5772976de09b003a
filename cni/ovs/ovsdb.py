"""A minimal OVSDB client (RFC 7047 JSON-RPC) for the Open_vSwitch schema, standard library only.

Just what the plugin needs: ensure a bridge, add/delete/find a port.  Each method is one
``transact`` where the protocol allows (``add_port`` pipelines its insert with a server-side
``wait`` for vswitchd's ``ofport``, so it costs one round trip plus vswitchd's own work).

Datum encoding (RFC 7047 5.1): sets are ``["set", [...]]`` (a single atom may stand alone),
maps ``["map", [[k, v], ...]]``, row references ``["uuid", "..."]`` / ``["named-uuid", "..."]``.
"""

from __future__ import annotations

import _socket as socket  # the C module: socket.py's enums cost ~10 ms per exec

from cni.lean import fastjson as json
from cni.lean.patience import patiently
from cni.lean.record import Factory, record
from cni.lean.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType
    from typing import Any

DB = "Open_vSwitch"
OPENFLOW_PROTOCOLS = ("OpenFlow10", "OpenFlow13", "OpenFlow14", "OpenFlow15")


class OvsdbError(Exception):
    """ovsdb-server unreachable, a transaction failed, or vswitchd rejected an interface."""


class OvsdbUnreachable(OvsdbError):
    """No ovsdb-server answers at the remote (not running yet, or the socket is wrong)."""


class PortExistsError(OvsdbError):
    """``add_port``: a port of that name exists already (on any bridge)."""


@record(frozen=True)
class BridgeInfo:
    name: str
    datapath_type: str
    uuid: str


@record(frozen=True)
class PortInfo:
    name: str
    ofport: int | None  # None: vswitchd has not assigned it yet; -1: the interface failed
    external_ids: dict[str, str] = Factory(dict)  # the Port's
    mac_in_use: str | None = None
    iface_type: str = ""
    error: str | None = None


# ---------------------------------------------------------------- datum helpers (pure)

def omap(d: dict[str, str]) -> list[Any]:
    return ["map", [[k, v] for k, v in sorted(d.items())]]


def from_map(datum: Any) -> dict[str, str]:
    return {k: v for k, v in datum[1]} if isinstance(datum, list) and datum and datum[0] == "map" else {}


def from_set(datum: Any) -> list[Any]:
    """Atoms of a set datum (a lone atom counts as a one-element set)."""
    if isinstance(datum, list) and datum and datum[0] == "set":
        return list(datum[1])
    return [datum]


def optional(datum: Any) -> Any:
    """A 0-or-1 column: its atom, or None for the empty set."""
    atoms = from_set(datum)
    return atoms[0] if atoms else None


def _uuid(datum: Any) -> str:
    return str(datum[1])


def _port_info(port_row: dict[str, Any], iface_row: dict[str, Any] | None) -> PortInfo:
    iface = iface_row or {}
    return PortInfo(
        name=port_row["name"],
        ofport=optional(iface.get("ofport", ["set", []])),
        external_ids=from_map(port_row.get("external_ids")),
        mac_in_use=optional(iface.get("mac_in_use", ["set", []])),
        iface_type=iface.get("type", ""),
        error=optional(iface.get("error", ["set", []])),
    )


_IFACE_COLS = ["_uuid", "name", "ofport", "mac_in_use", "type", "error"]
_PORT_COLS = ["name", "external_ids", "interfaces"]


def _join(ports: list[dict[str, Any]], ifaces: list[dict[str, Any]]) -> list[PortInfo]:
    by_uuid = {_uuid(r["_uuid"]): r for r in ifaces}
    out = []
    for p in ports:
        refs = [_uuid(u) for u in from_set(p["interfaces"])]
        out.append(_port_info(p, by_uuid.get(refs[0]) if refs else None))
    return sorted(out, key=lambda i: i.name)


# ---------------------------------------------------------------- the client


class Ovsdb:
    """One connection to ovsdb-server (``unix:/path/db.sock`` or ``tcp:host:port``)."""

    def __init__(self, remote: str, timeout: float = 10.0) -> None:
        self.remote = remote
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = ""
        self._id = 0

    # -- transport

    def _connect(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        kind, _, where = self.remote.partition(":")
        try:
            if kind == "unix":
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                s.settimeout(self.timeout)
                s.connect(where)
            elif kind == "tcp":
                host, _, port = where.rpartition(":")
                import socket as socket_py  # tcp: remotes are rare; unix is the norm

                s = socket_py.create_connection((host.strip("[]"), int(port)), self.timeout)
            else:
                raise OvsdbError(f"unsupported OVSDB remote {self.remote!r} (unix:PATH or tcp:HOST:PORT)")
        except OSError as e:
            raise OvsdbUnreachable(f"cannot connect to OVSDB at {where}: ovsdb-server is not running "
                                   f"or the socket is wrong ({e.strerror or e})") from e
        self._sock = s
        return s

    def connect(self, wait: float = 0.0, notice: Callable[[str], None] | None = None) -> None:
        """Connect now, trying again for up to ``wait`` seconds while no ovsdb-server answers (a
        Node that has just started: the switch's container starts beside the kubelet's first
        calls); :class:`OvsdbUnreachable` after that. ``notice`` hears when the wait starts."""
        said = f"waiting up to {wait:g} s for ovsdb-server at {self.remote}"
        patiently(self._connect, OvsdbUnreachable, wait, None if notice is None else lambda: notice(said))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self._buf = ""

    def __enter__(self) -> Ovsdb:  # noqa: PYI034 (typing costs ms to import)
        return self

    def __exit__(self, t: type[BaseException] | None, v: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _send(self, method: str, params: list[Any]) -> int:
        self._id += 1
        msg = json.dumps({"method": method, "params": params, "id": self._id}, compact=True)
        try:
            self._connect().sendall(msg.encode())
        except OSError as e:
            self.close()
            raise OvsdbError(f"OVSDB {self.remote}: send failed: {e}") from e
        return self._id

    def _receive(self, want: int) -> Any:
        """The ``result`` of reply ``want``; answers echo requests and skips other messages."""
        sock = self._connect()
        while True:
            self._buf = self._buf.lstrip()
            if self._buf:
                try:
                    msg, end = json.raw_decode(self._buf)
                except ValueError:  # an incomplete message: read more
                    msg, end = None, 0
                if msg is not None:
                    self._buf = self._buf[end:]
                    if msg.get("method") == "echo":
                        reply = json.dumps({"result": msg.get("params", []), "error": None, "id": msg["id"]})
                        sock.sendall(reply.encode())
                    elif msg.get("id") == want:
                        if msg.get("error") is not None:
                            raise OvsdbError(f"OVSDB {self.remote}: {msg['error']}")
                        return msg.get("result")
                    continue
            try:
                chunk = sock.recv(1 << 16)
            except OSError as e:
                self.close()
                raise OvsdbError(f"OVSDB {self.remote}: receive failed: {e}") from e
            if not chunk:
                self.close()
                raise OvsdbError(f"OVSDB {self.remote}: connection closed by ovsdb-server")
            self._buf += chunk.decode()

    def transact(self, *ops: dict[str, Any]) -> list[dict[str, Any]]:
        """Run one transaction; raise OvsdbError naming the first failed operation."""
        return _check(self._receive(self._send("transact", [DB, *ops])), ops)

    # -- bridges

    def bridge(self, name: str) -> BridgeInfo | None:
        rows = self.transact(_select("Bridge", [["name", "==", name]], ["_uuid", "name", "datapath_type"]))
        if not rows[0]["rows"]:
            return None
        r = rows[0]["rows"][0]
        return BridgeInfo(r["name"], r["datapath_type"], _uuid(r["_uuid"]))

    def ensure_bridge(self, name: str, datapath_type: str, timeout: float = 5.0) -> None:
        """Create ``name`` (fail_mode=secure: no NORMAL flow) unless a bridge of that name exists,
        then wait until vswitchd has brought it up (its local port has an ofport, so the
        ``<bridge>.mgmt`` socket exists for ovs-ofctl).

        The create is one transaction guarded by a ``wait`` that fails when the bridge exists,
        so two callers racing cannot create it twice; the readiness ``wait`` is pipelined."""
        ops = [
            _absent("Bridge", name),
            {"op": "insert", "table": "Interface", "uuid-name": "iface",
             "row": {"name": name, "type": "internal"}},
            {"op": "insert", "table": "Port", "uuid-name": "port",
             "row": {"name": name, "interfaces": ["named-uuid", "iface"]}},
            {"op": "insert", "table": "Bridge", "uuid-name": "br",
             "row": {"name": name, "datapath_type": datapath_type, "fail_mode": "secure",
                     "protocols": ["set", list(OPENFLOW_PROTOCOLS)],
                     "ports": ["named-uuid", "port"]}},
            {"op": "mutate", "table": "Open_vSwitch", "where": [],
             "mutations": [["bridges", "insert", ["named-uuid", "br"]]]},
        ]
        ready = [_wait_ofport(name, timeout)]
        self._connect().settimeout(max(self.timeout, timeout + 2))
        first = self._send("transact", [DB, *ops])
        second = self._send("transact", [DB, *ready])
        try:
            _check(self._receive(first), ops)
        except _WaitTimedOut:
            pass  # it exists already
        except OvsdbError:
            self.close()
            raise
        try:
            _check(self._receive(second), ready)
        except _WaitTimedOut:
            raise OvsdbError(f"bridge {name}: vswitchd did not bring it up within {timeout}s "
                             "(is ovs-vswitchd running?)") from None

    # -- ports

    def add_port(self, bridge: str, name: str, external_ids: dict[str, str], iface_type: str = "",
                 mac: str | None = None, options: dict[str, str] | None = None,
                 timeout: float = 5.0) -> int:
        """Add port ``name`` to ``bridge`` and return the ofport vswitchd assigns to it.

        Raises PortExistsError if the name is taken, OvsdbError (with vswitchd's ``error`` text)
        if the interface cannot be opened; the port is then removed again."""
        return self.add_port_start(bridge, name, external_ids, iface_type, mac, options, timeout).finish()

    def add_port_start(self, bridge: str, name: str, external_ids: dict[str, str], iface_type: str = "",
                       mac: str | None = None, options: dict[str, str] | None = None, timeout: float = 5.0,
                       ofports: Sequence[int] = ()) -> PendingPort:
        """Commit the port's rows and return while vswitchd is still opening the interface.

        The insert and a server-side ``wait`` for a non-empty ``ofport`` go out back to back; this
        returns once the insert is committed (one round trip to ovsdb-server), and
        :meth:`PendingPort.finish` collects the ofport when vswitchd has assigned it, so the caller
        can work in between.  ``ofports``: candidate ``ofport_request`` values, tried in order
        until one is free (no other interface requests or holds it; checked inside the same
        transaction, so two callers cannot take the same number): the caller knows the ofport
        before vswitchd does, and can install flows for it meanwhile."""
        iface: dict[str, Any] = {"name": name, "type": iface_type, "external_ids": omap(external_ids)}
        if mac:
            iface["mac"] = mac
        if options:
            iface["options"] = omap(options)
        where = [["name", "==", name]]
        wait = [_wait_ofport(name, timeout), _select("Interface", where, ["ofport", "error"])]
        self._connect().settimeout(max(self.timeout, timeout + 2))
        for requested in ofports or (None,):
            guard = [_absent("Port", name)]
            if requested is not None:
                iface["ofport_request"] = requested
                guard += [_unused("ofport_request", requested), _unused("ofport", requested)]
            insert = [
                *guard,
                {"op": "insert", "table": "Interface", "uuid-name": "iface", "row": iface},
                {"op": "insert", "table": "Port", "uuid-name": "port",
                 "row": {"name": name, "interfaces": ["named-uuid", "iface"],
                         "external_ids": omap(external_ids)}},
                {"op": "mutate", "table": "Bridge", "where": [["name", "==", bridge]],
                 "mutations": [["ports", "insert", ["named-uuid", "port"]]]},
            ]
            first = self._send("transact", [DB, *insert])
            second = self._send("transact", [DB, *wait])
            try:
                done = _check(self._receive(first), insert)
            except _WaitTimedOut as e:
                if e.index == 0:
                    self.close()  # drops the pending wait
                    raise PortExistsError(f"cannot add port {name}: a port of that name exists") from None
                self._receive(second)  # no row of that name: the wait answers at once
                continue  # that ofport is taken: the next candidate
            except OvsdbError:
                self.close()
                raise
            if done[-1].get("count") != 1:  # the rows were garbage-collected
                self.close()
                raise OvsdbError(f"cannot add port {name}: bridge {bridge} does not exist")
            return PendingPort(self, bridge, name, second, wait, timeout, requested)
        raise OvsdbError(f"cannot add port {name}: ofports {', '.join(map(str, ofports))} are all taken")

    def del_port(self, bridge: str, name: str) -> bool:
        """Remove port ``name`` from ``bridge`` (OVSDB garbage-collects the rows); False if absent."""
        rows = self.transact(_select("Port", [["name", "==", name]], ["_uuid"]))[0]["rows"]
        if not rows:
            return False
        done = self.transact({"op": "mutate", "table": "Bridge", "where": [["name", "==", bridge]],
                              "mutations": [["ports", "delete", ["set", [r["_uuid"] for r in rows]]]]})
        return bool(done[0].get("count"))

    def port(self, name: str) -> PortInfo | None:
        where = [["name", "==", name]]
        res = self.transact(_select("Port", where, _PORT_COLS), _select("Interface", where, _IFACE_COLS))
        if not res[0]["rows"]:
            return None
        return _join(res[0]["rows"], res[1]["rows"])[0]

    def find_ports(self, external_ids: dict[str, str]) -> list[PortInfo]:
        """Ports whose external_ids include every given pair.

        The plugin writes the same external_ids on a Port and its Interface, so one round trip
        selects both by them (not every Interface of the bridge); an Interface without them
        (written by someone else) is fetched by name in a second one."""
        where = [["external_ids", "includes", omap(external_ids)]]
        res = self.transact(_select("Port", where, _PORT_COLS), _select("Interface", where, _IFACE_COLS))
        ports, ifaces = res[0]["rows"], res[1]["rows"]
        have = {_uuid(r["_uuid"]) for r in ifaces}
        if any(_uuid(u) not in have for p in ports for u in from_set(p["interfaces"])[:1]):
            by_name = self.transact(*(_select("Interface", [["name", "==", p["name"]]], _IFACE_COLS) for p in ports))
            ifaces += [r for res in by_name for r in res["rows"]]
        return _join(ports, ifaces)

    def ports(self, bridge: str) -> list[PortInfo]:
        res = self.transact(_select("Bridge", [["name", "==", bridge]], ["ports"]),
                            _select("Port", [], ["_uuid", *_PORT_COLS]),
                            _select("Interface", [], _IFACE_COLS))
        if not res[0]["rows"]:
            return []
        wanted = {_uuid(u) for u in from_set(res[0]["rows"][0]["ports"])}
        return _join([p for p in res[1]["rows"] if _uuid(p["_uuid"]) in wanted], res[2]["rows"])


class PendingPort:
    """A port whose rows are committed while vswitchd is still opening its interface."""

    __slots__ = ("_reply", "_wait", "bridge", "db", "name", "ofport_request", "timeout")

    def __init__(self, db: Ovsdb, bridge: str, name: str, reply: int, wait: list[dict[str, Any]],
                 timeout: float, ofport_request: int | None) -> None:
        self.db, self.bridge, self.name = db, bridge, name
        self._reply, self._wait, self.timeout = reply, wait, timeout
        self.ofport_request = ofport_request  # the ofport asked for, or None (vswitchd picks)

    def finish(self) -> int:
        """The ofport vswitchd assigned; OvsdbError (port removed again) if it could not open it."""
        db, name = self.db, self.name
        try:
            rows = _check(db._receive(self._reply), self._wait)[1]["rows"]
        except _WaitTimedOut:
            info = db.port(name)
            raise OvsdbError(f"port {name}: vswitchd assigned no ofport within {self.timeout}s "
                             f"(is ovs-vswitchd running?){_err(info)}") from None
        ofport = optional(rows[0]["ofport"]) if rows else None
        if ofport is None or ofport < 0:
            db.del_port(self.bridge, name)  # leave no broken port behind
            raise OvsdbError(f"port {name}: vswitchd could not add the interface: "
                             f"{optional(rows[0]['error']) if rows else 'interface vanished'}")
        return int(ofport)


class _WaitTimedOut(OvsdbError):
    """A ``wait`` operation's condition did not hold (used as "exists"/"not yet" signals)."""

    def __init__(self, text: str, index: int = -1) -> None:
        super().__init__(text)
        self.index = index  # which operation of the transaction


def _select(table: str, where: list[Any], columns: list[str]) -> dict[str, Any]:
    return {"op": "select", "table": table, "where": where, "columns": columns}


def _absent(table: str, name: str) -> dict[str, Any]:
    """A ``wait`` op that fails at once when a row named ``name`` exists."""
    return {"op": "wait", "table": table, "where": [["name", "==", name]], "columns": ["name"],
            "until": "==", "rows": [], "timeout": 0}


def _unused(column: str, ofport: int) -> dict[str, Any]:
    """A ``wait`` op that fails at once when any interface has ``column`` == ``ofport``."""
    return {"op": "wait", "table": "Interface", "where": [[column, "==", ofport]], "columns": ["name"],
            "until": "==", "rows": [], "timeout": 0}


def _wait_ofport(iface: str, timeout: float) -> dict[str, Any]:
    """A ``wait`` op that returns once vswitchd has written the interface's ``ofport``.

    (Or at once when no such interface row exists: zero rows differ from the one given.)"""
    return {"op": "wait", "table": "Interface", "where": [["name", "==", iface]], "columns": ["ofport"],
            "until": "!=", "rows": [{"ofport": ["set", []]}], "timeout": int(timeout * 1000)}


def _err(info: PortInfo | None) -> str:
    return f": {info.error}" if info and info.error else ""


def _check(result: Any, ops: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Raise for the first failed operation of a transaction result (RFC 7047 4.1.3)."""
    if not isinstance(result, list):
        raise OvsdbError(f"unexpected transact result: {result!r}")
    for i, r in enumerate(result):
        if isinstance(r, dict) and "error" in r:
            op = ops[i]["op"] if i < len(ops) else "commit"
            text = f"{r['error']}: {r.get('details', '')}".rstrip(": ")
            if r["error"] == "timed out" and op == "wait":
                raise _WaitTimedOut(text, i)
            raise OvsdbError(f"OVSDB {op} on {ops[i].get('table', '?') if i < len(ops) else '-'}: {text}")
    return result
