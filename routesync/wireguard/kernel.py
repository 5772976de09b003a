"""The kernel's WireGuard: whether this kernel has it, and its link made and removed.

(Placeholder through ``ip link``; the rtnetlink version replaces it with the same functions.)"""

from __future__ import annotations

import subprocess


def _ip(args: list[str], netns: str | None) -> subprocess.CompletedProcess[str]:
    argv = (["ip", "-n", netns] if netns else ["ip"]) + args
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def kernel_supported(netns: str | None = None) -> bool:
    probe = "ferry-wgprobe"
    r = _ip(["link", "add", probe, "type", "wireguard"], netns)
    if r.returncode == 0:
        _ip(["link", "del", probe], netns)
        return True
    return False


def create_link(name: str, netns: str | None = None) -> None:
    r = _ip(["link", "add", name, "type", "wireguard"], netns)
    if r.returncode != 0:
        raise OSError(f"ip link add {name} type wireguard: {r.stderr.strip()}")


def delete_link(name: str, netns: str | None = None) -> None:
    _ip(["link", "del", name], netns)
