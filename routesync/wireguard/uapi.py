"""The userspace implementation's configuration protocol (wireguard-go's UAPI, the "cross-platform
userspace implementation" protocol of wireguard.com/xplatform): a Unix socket
``<runDir>/<interface>.sock``, ``get=1`` / ``set=1`` requests of ``key=value`` lines ended by a
blank line, answered by ``errno=N``.  Keys in hex.  Standard library only; one connection per
request (the implementation serves each on its own).

:class:`Uapi` is the :class:`~routesync.wireguard.model.WgBackend` of the userspace device."""

from __future__ import annotations

import os
import socket

from . import keys
from .model import USERSPACE, WgChange, WgDeviceState, WgPeerState

KICK = 25  # s: the keepalive interval a kick turns on (a peer whose own is off gets 0 back at once)
TIMEOUT = 5.0  # s: a live implementation answers in well under a millisecond


class UapiError(OSError):
    """The implementation answered ``errno`` != 0 (the request named in the message)."""


def socket_path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, f"{name}.sock")


def set_request(change: WgChange) -> str:
    """The ``set=1`` request of one change (pure: tests read it).  Removals come first, so an
    allowed IP moves from one peer to another inside the one transaction."""
    lines = ["set=1"]
    if change.private_key is not None:
        lines.append(f"private_key={keys.hex_of(change.private_key)}")
    if change.listen_port is not None:
        lines.append(f"listen_port={change.listen_port}")
    ordered = [p for p in change.peers if p.remove] + [p for p in change.peers if not p.remove]
    for p in ordered:
        lines.append(f"public_key={keys.hex_of(p.public_key)}")
        if p.remove:
            lines.append("remove=true")
            continue
        if p.endpoint:
            lines.append(f"endpoint={p.endpoint}")
        if p.kick:  # 0 then non-zero: the implementation sends a keepalive (a handshake first) at once
            lines += ["persistent_keepalive_interval=0", f"persistent_keepalive_interval={p.keepalive or KICK}"]
        else:
            lines.append(f"persistent_keepalive_interval={p.keepalive}")
        lines.append("replace_allowed_ips=true")
        lines += [f"allowed_ip={a}" for a in p.allowed_ips]
        if p.kick and not p.keepalive:  # its own keepalive is off: a second block puts it back
            lines += [f"public_key={keys.hex_of(p.public_key)}", "persistent_keepalive_interval=0"]
    return "\n".join(lines) + "\n\n"


def parse_get(text: str) -> WgDeviceState:
    """A ``get=1`` answer (without its ``errno`` line or with it) into a :class:`WgDeviceState`."""
    private = None
    port = 0
    peers: list[WgPeerState] = []
    cur: dict | None = None

    def close() -> None:
        if cur is not None:
            peers.append(WgPeerState(
                public_key=cur["key"], endpoint=cur.get("endpoint"), allowed_ips=tuple(sorted(cur["ips"])),
                keepalive=cur.get("keepalive", 0), last_handshake=cur.get("hs", 0.0),
                rx_bytes=cur.get("rx", 0), tx_bytes=cur.get("tx", 0)))

    for line in text.splitlines():
        if not line or "=" not in line:
            continue
        k, v = line.split("=", 1)
        if k == "private_key":
            private = keys.b64_of_hex(v)
        elif k == "listen_port":
            port = int(v)
        elif k == "public_key":
            close()
            cur = {"key": keys.b64_of_hex(v), "ips": []}
        elif cur is None:
            continue
        elif k == "endpoint":
            cur["endpoint"] = v
        elif k == "allowed_ip":
            cur["ips"].append(v)
        elif k == "persistent_keepalive_interval":
            cur["keepalive"] = int(v)
        elif k == "last_handshake_time_sec":
            cur["hs"] = cur.get("hs", 0.0) + int(v)
        elif k == "last_handshake_time_nsec":
            cur["hs"] = cur.get("hs", 0.0) + int(v) / 1e9
        elif k == "rx_bytes":
            cur["rx"] = int(v)
        elif k == "tx_bytes":
            cur["tx"] = int(v)
    close()
    public = keys.public_of(private) if private else None
    return WgDeviceState(public_key=public, listen_port=port, peers=tuple(sorted(peers, key=lambda p: p.public_key)),
                         private_key=private)


class Uapi:
    """The userspace device's backend: ``<run_dir>/<name>.sock``."""

    kind = USERSPACE

    def __init__(self, run_dir: str) -> None:
        self.run_dir = run_dir

    def alive(self, name: str) -> bool:
        try:
            self._request(name, "get=1\n\n")
        except (LookupError, OSError):
            return False
        return True

    def read(self, name: str) -> WgDeviceState:
        return parse_get(self._request(name, "get=1\n\n"))

    def configure(self, name: str, change: WgChange) -> None:
        if not change.empty:
            self._request(name, set_request(change))

    def _request(self, name: str, request: str) -> str:
        path = socket_path(self.run_dir, name)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(TIMEOUT)
        try:
            try:
                s.connect(path)
            except (FileNotFoundError, ConnectionRefusedError):
                raise LookupError(f"no WireGuard device {name} (no live {path})") from None
            s.sendall(request.encode())
            buf = b""
            while not buf.endswith(b"\n\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        finally:
            s.close()
        text = buf.decode()
        code = 0
        for line in text.splitlines():
            if line.startswith("errno="):
                code = int(line[6:])
        if code:
            what = request.split("\n", 1)[0]
            raise UapiError(code, f"WireGuard {name}: {what} refused: {os.strerror(code) if code > 0 else code}")
        return text


__all__ = ["Uapi", "UapiError", "parse_get", "set_request", "socket_path"]
