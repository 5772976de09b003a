"""Small traffic helpers run inside Pods: ping and a TCP echo exchange."""

from __future__ import annotations

import subprocess
import sys

ECHO_SERVER = r"""
import socket, sys
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
print("ready", flush=True)
s.settimeout(60)
c, _ = s.accept()
data = b""
while len(data) < int(sys.argv[3]):
    chunk = c.recv(65536)
    if not chunk:
        break
    data += chunk
c.sendall(data)
c.close()
"""

ECHO_CLIENT = r"""
import socket, sys, os
size = int(sys.argv[3])
payload = os.urandom(size)
fam = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)  # the server listens already
c.sendall(payload)
back = b""
while len(back) < size:
    chunk = c.recv(65536)
    if not chunk:
        break
    back += chunk
sys.exit(0 if back == payload else 3)
"""


def ping(netns: str, address: str, count: int = 2, timeout: int = 5) -> bool:
    argv = ["ip", "netns", "exec", netns, "ping", "-n", "-c", str(count), "-i", "0.2", "-W", "1",
            "-w", str(timeout), address]
    return subprocess.run(argv, check=False, capture_output=True).returncode == 0


def tcp_echo(server_ns: str, server_ip: str, client_ns: str, port: int = 5201, size: int = 200_000) -> bool:
    """A TCP exchange of ``size`` random bytes, echoed back intact (checksums included)."""
    srv = subprocess.Popen(["ip", "netns", "exec", server_ns, sys.executable, "-c", ECHO_SERVER, server_ip,
                            str(port), str(size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert srv.stdout is not None
        if srv.stdout.readline().strip() != b"ready":  # listening (not a guess at how long that takes)
            return False
        cli = subprocess.run(["ip", "netns", "exec", client_ns, sys.executable, "-c", ECHO_CLIENT, server_ip,
                              str(port), str(size)], check=False, capture_output=True, timeout=90)
        return cli.returncode == 0 and srv.wait(timeout=60) == 0
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
