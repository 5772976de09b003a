"""TX checksum offload on/off through the SIOCETHTOOL ioctl (what ``ethtool -K IF tx on|off`` does).

A netdev (userspace) OVS datapath never fills in partial checksums, so a Pod's veth end must
send complete ones: TX checksum offload off.  Acts in the calling thread's network namespace.
"""

from __future__ import annotations

import _socket as socket
import fcntl
import struct
import sys

SIOCETHTOOL = 0x8946
ETHTOOL_GTXCSUM = 0x16
ETHTOOL_STXCSUM = 0x17


def _ethtool(ifname: str, cmd: int, data: int = 0) -> int:
    name = ifname.encode()
    if not name or len(name) > 15:
        raise ValueError(f"bad interface name {ifname!r}")
    # struct ethtool_value {u32 cmd; u32 data;} in memory whose address the ioctl gets.  Through
    # _ctypes (already loaded for setns): ``array`` would import collections.abc (~5 ms).
    from _ctypes import _SimpleCData, addressof

    class U64(_SimpleCData):
        _type_ = "Q"

    little = sys.byteorder == "little"  # cmd is the first u32 in memory
    value = U64(cmd | (data << 32) if little else (cmd << 32) | data)
    # struct ifreq: char ifr_name[16]; union { void *ifr_data; ... } (padded to 40 bytes).
    ifreq = struct.pack("16sP", name, addressof(value)).ljust(40, b"\0")
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifreq)
    finally:
        s.close()
    return int(value.value >> 32 if little else value.value & 0xFFFFFFFF)


def get_tx_checksum(ifname: str) -> bool:
    """Whether any TX checksum offload is on for ``ifname``."""
    return bool(_ethtool(ifname, ETHTOOL_GTXCSUM))


def set_tx_checksum(ifname: str, on: bool) -> None:
    """Turn every TX checksum offload of ``ifname`` on or off (the kernel adjusts TSO with it)."""
    _ethtool(ifname, ETHTOOL_STXCSUM, 1 if on else 0)
