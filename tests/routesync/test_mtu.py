from __future__ import annotations

import pytest

from routesync.mtu import pod_mtu


@pytest.mark.parametrize("mode,tunnel,v6,expected", [
    ("encap", "vxlan", False, 1450), ("encap", "geneve", False, 1450), ("encap", "gre", False, 1458),
    ("encap", "stt", False, 1428), ("encap", "vxlan", True, 1430), ("hybrid", "gre", True, 1438),
    ("noEncap", "vxlan", True, 1500), ("networkPolicyOnly", "geneve", False, 1500),
])
def test_overheads(mode: str, tunnel: str, v6: bool, expected: int) -> None:
    assert pod_mtu(1500, mode, tunnel, v6) == expected


def test_cap_and_override() -> None:
    assert pod_mtu(65536, "noEncap", "vxlan") == 65000
    assert pod_mtu(65536, "encap", "vxlan") == 65000  # 65486 capped
    assert pod_mtu(9000, "encap", "vxlan") == 8950
    assert pod_mtu(1500, "encap", "vxlan", default_mtu=1400) == 1400
