"""cni.ovs.openflow.session: a switch that goes away under the plugin is named as such, whether the
connect is refused or a connection it accepted is reset (an ADD right after ovs-vswitchd was
killed may connect before the kernel closed the listener); no root, a socket in a temp dir."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from cni.ovs.openflow.session import OpenFlowError, Session


def test_a_refused_and_a_reset_connection_both_ask_for_ovs_vswitchd(tmp_path: Path) -> None:
    with pytest.raises(OpenFlowError, match=r"is ovs-vswitchd running\?"):
        Session("br-int", str(tmp_path)).bundle([b"x"])

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "br-int.mgmt"))
    listener.listen(1)

    def accept_and_reset() -> None:
        for _ in range(2):  # the session sends a lost bundle once more, on a new connection
            conn, _ = listener.accept()
            conn.close()  # the switch dies with the connection accepted

    t = threading.Thread(target=accept_and_reset)
    t.start()
    try:
        with pytest.raises(OpenFlowError, match=r"is ovs-vswitchd running\?"):
            Session("br-int", str(tmp_path), timeout=5).bundle([b"x"])
    finally:
        t.join(timeout=5)
        listener.close()
