"""Make sure ``import ovs`` means Open vSwitch's Python package (ovsdbapp needs ``ovs.db``).

pytest puts ``tests/`` on sys.path for packages under it, and ``tests/ovs_instance.py`` (the private-OVS
helper) would then shadow the real ``ovs`` package.  Import the real one first, without
``tests/`` on the path; later ``import ovs`` finds it in sys.modules."""

from __future__ import annotations

import os
import sys

_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if not hasattr(sys.modules.get("ovs"), "__path__"):
    sys.modules.pop("ovs", None)
    _saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _TESTS]
    try:
        import ovs.db.idl  # noqa: F401
    finally:
        sys.path[:] = _saved
