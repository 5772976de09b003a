"""A connection to one bridge's management socket (``unix:<run_dir>/<bridge>.mgmt``) in OpenFlow
1.3: HELLO, messages, a BARRIER or an atomic bundle, echo replies, and the switch's errors raised.

The plugin opens one per ADD/DEL and closes it (:meth:`Session.transact`: HELLO, the flow-mods
and a BARRIER in one write, then read to the barrier's reply); route-sync keeps one open and sends
bundles on it (:meth:`Session.bundle`), reconnecting once when the switch went away.
Standard library only."""

from __future__ import annotations

import _socket

from cni.lean.typecheck import TYPE_CHECKING
from cni.ovs.openflow import codec
from cni.ovs.openflow.codec import (
    OFP_VERSION,
    OFPBCT_COMMIT_REPLY,
    OFPBCT_COMMIT_REQUEST,
    OFPBCT_OPEN_REQUEST,
    OFPT_BARRIER_REPLY,
    OFPT_ECHO_REPLY,
    OFPT_ECHO_REQUEST,
    OFPT_ERROR,
    OFPT_HELLO,
    OpenFlowError,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Self


def screen(sock: _socket.socket, msg: bytes, bridge: str) -> tuple[int, int] | None:
    """What every OpenFlow connection does with a message before its reader looks at it: raise on
    OFPT_ERROR and on a switch below OpenFlow 1.3, answer an echo request (then None); else the
    message's (type, xid) for the reader."""
    version, mtype, _length, xid = codec.HEADER.unpack_from(msg)
    if mtype == OFPT_ERROR:
        raise codec.refused(msg, f"bridge {bridge}")
    if mtype == OFPT_HELLO and version < OFP_VERSION:
        raise OpenFlowError(f"bridge {bridge}: OpenFlow 1.3 not enabled on the bridge")
    if mtype == OFPT_ECHO_REQUEST:
        sock.sendall(bytes([version, OFPT_ECHO_REPLY]) + msg[2:])
        return None
    return mtype, xid


# what a lost connection means to the caller: the switch stopped or restarted under it (an ADD
# right after a SIGKILL may connect before the kernel closed the listener, then read a reset)
LOST = " (is ovs-vswitchd running?)"

class ConnectionLost(OpenFlowError):
    """The switch closed the connection (or it could not be written)."""


class Session:
    """One bridge's flow table over its management socket; opened on first use."""

    def __init__(self, bridge: str, run_dir: str, timeout: float = 10.0) -> None:
        self.bridge = bridge
        self.path = f"{run_dir.rstrip('/')}/{bridge}.mgmt"
        self.timeout = timeout
        self._sock: _socket.socket | None = None
        self._buf = b""
        self._xid = 0
        self._bundle_id = 0
        self.connects = 0  # connections opened (tests, metrics)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf = None, b""

    def next_xid(self) -> int:
        self._xid = self._xid % 0xFFFFFFF0 + 1
        return self._xid

    # -- one-shot: flow-mods then a barrier
    def transact(self, messages: Sequence[bytes]) -> None:
        """``messages`` then a BARRIER; raise on the first OFPT_ERROR the switch answers."""
        barrier = self.next_xid()
        self._send(b"".join(messages) + codec.barrier(barrier))
        self._wait(lambda msg, xid: msg[1] == OFPT_BARRIER_REPLY and xid == barrier)

    # -- atomic bundles
    def bundle(self, messages: Sequence[bytes]) -> None:
        """Commit ``messages`` (flow-mods, any xid) atomically; sent once more on a new connection
        when the connection was lost (a committed bundle of delete-by-cookie + adds is idempotent)."""
        if not messages:
            return
        try:
            self._bundle(messages)
        except ConnectionLost:
            self.close()
            self._bundle(messages)

    def _bundle(self, messages: Sequence[bytes]) -> None:
        """OPEN + the ADD_MESSAGEs + a BARRIER; COMMIT only once the barrier answered without an
        error (OVS commits what a bundle holds even when an ADD_MESSAGE was refused)."""
        self._bundle_id = bid = self._bundle_id % 0xFFFFFFF0 + 1
        parts = [codec.bundle_control(bid, OFPBCT_OPEN_REQUEST, self.next_xid())]
        parts += [codec.bundle_add(bid, codec.with_xid(m, self.next_xid())) for m in messages]
        barrier = self.next_xid()
        parts.append(codec.barrier(barrier))
        self._send(b"".join(parts))
        self._wait(lambda msg, xid: msg[1] == OFPT_BARRIER_REPLY and xid == barrier)
        commit = self.next_xid()
        self._send(codec.bundle_control(bid, OFPBCT_COMMIT_REQUEST, commit))
        self._wait(lambda msg, xid: xid == commit and codec.bundle_reply(msg) == (bid, OFPBCT_COMMIT_REPLY))

    # -- the connection
    def _connect(self) -> tuple[_socket.socket, bytes]:
        """The open socket, and the HELLO to send first when it was just opened."""
        if self._sock is not None:
            return self._sock, b""
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise OpenFlowError(f"bridge {self.bridge}: cannot connect to {self.path}: {e.strerror}"
                                f"{LOST}") from None
        self._sock, self._buf = sock, b""
        self.connects += 1
        return sock, codec.hello()

    def _send(self, data: bytes) -> None:
        sock, hello = self._connect()
        try:
            sock.sendall(hello + data)
        except OSError as e:
            self.close()
            raise ConnectionLost(f"bridge {self.bridge}: {e}{LOST}") from None

    def _wait(self, done: Callable[[bytes, int], bool]) -> None:
        """Read until a message ``done`` accepts; answer echoes; raise on OFPT_ERROR (and close:
        OVS discards an open bundle with the connection, and no stale reply is read later)."""
        sock = self._sock
        assert sock is not None
        try:
            while True:
                messages, self._buf = codec.split(self._buf)
                for i, msg in enumerate(messages):
                    got = screen(sock, msg, self.bridge)
                    if got is not None and done(msg, got[1]):
                        self._buf = b"".join(messages[i + 1:]) + self._buf
                        return
                data = sock.recv(65536)
                if not data:
                    raise ConnectionLost(f"bridge {self.bridge}: the switch closed the connection{LOST}")
                self._buf += data
        except OpenFlowError:
            self.close()
            raise
        except OSError as e:
            self.close()
            raise ConnectionLost(f"bridge {self.bridge}: {e}{LOST}") from None
