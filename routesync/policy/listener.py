"""The denied log's listener: one OpenFlow connection of its own to the bridge's management socket,
in a thread beside the daemon's loop (flow programming never waits on it, nor it on flows).

On connecting it asks for packet-ins as NXT_PACKET_IN2 (they carry the ``controller()``
action's userdata) and, with the async config, for those of reason ``action`` only (a
management-socket connection gets none by default), then a barrier: once answered, it is
listening (:attr:`DeniedListener.listening`).  Each packet-in is decoded
(:mod:`cni.ovs.openflow.packetin`) and offered to the bounded log
(:class:`routesync.policy.deniedlog.DeniedLog`).  When ovs-vswitchd goes away (a restart) the
connection is made again, with a backoff of 0.1 s doubling to 2 s."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import Self

from cni.ovs.openflow import codec, packetin
from cni.ovs.openflow.codec import (
    OFPT_BARRIER_REPLY,
    OpenFlowError,
)
from cni.ovs.openflow.session import screen

from .deniedlog import DeniedLog

log = logging.getLogger(__name__)
DENIED = logging.getLogger("routesync.policy.denied")  # the lines themselves

BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
POLL = 0.5  # s: how long a read waits before looking at the stop flag


class DeniedListener:
    """Packet-ins of ``bridge`` (``unix:<run_dir>/<bridge>.mgmt``) into ``denied``."""

    def __init__(self, bridge: str, run_dir: str, denied: DeniedLog,
                 emit: Callable[[str], None] | None = None) -> None:
        self.bridge = bridge
        self.emit = emit if emit is not None else _log_line  # where a line goes (tests: a list)
        self.path = f"{run_dir.rstrip('/')}/{bridge}.mgmt"
        self.denied = denied
        self.stop = threading.Event()
        self.listening = threading.Event()  # set while a connection is asking for packet-ins
        self.connects = 0  # connections that got as far as listening (tests, metrics)
        self.packet_ins = 0
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        self._thread = threading.Thread(target=self.run, name="denied-log", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def run(self) -> None:
        backoff = BACKOFF_MIN
        while not self.stop.is_set():
            try:
                self._listen()
                backoff = BACKOFF_MIN
            except (OSError, OpenFlowError, ValueError) as e:
                if self.listening.is_set():
                    log.warning("denied log: connection to %s lost (%s); connecting again", self.path, e)
                else:
                    log.debug("denied log: cannot listen on %s: %s", self.path, e)
                self.listening.clear()
                self.stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
            else:
                self.listening.clear()

    def _listen(self) -> None:
        """One connection, until it is lost (raises) or the listener is stopped (returns)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(POLL)
            sock.connect(self.path)
            sock.sendall(codec.hello() + codec.set_packet_in2(1) + codec.set_async(2) + codec.barrier(3))
            buf = b""
            while not self.stop.is_set():
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    raise OpenFlowError(f"bridge {self.bridge}: the switch closed the connection")
                messages, buf = codec.split(buf + data)
                for msg in messages:
                    self._message(sock, msg)

    def _message(self, sock: socket.socket, msg: bytes) -> None:
        got = screen(sock, msg, self.bridge)
        if got is None:
            return
        mtype, xid = got
        if mtype == OFPT_BARRIER_REPLY and xid == 3 and not self.listening.is_set():
            self.connects += 1
            self.listening.set()
            log.info("denied log: listening for packet-ins on %s", self.path)
        else:
            pin = packetin.packet_in2(msg)
            if pin is None:
                return
            self.packet_ins += 1
            line = self.denied.offer(packetin.connection(pin.packet), pin.userdata)
            if line is not None:
                self.emit(line)


def _log_line(line: str) -> None:
    DENIED.info("%s", line)
