"""route-sync's OpenFlow session: :class:`cni.ovs.openflow.session.Session` (one persistent
connection to the bridge's management socket, atomic bundles, one reconnect when ovs-vswitchd
went away) plus a cache of encoded flow-mods, since route-sync sends the same flows again and
again (a peer's flows are re-sent whenever its group is replaced)."""

from __future__ import annotations

from collections.abc import Iterable

from cni.ovs.openflow import codec
from cni.ovs.openflow.session import Session
from cni.pipeline.tables import Cookie, Flow

CACHE_LIMIT = 200_000


class OpenFlowSession(Session):
    """One bridge's flow table over a persistent management-socket connection."""

    def __init__(self, bridge: str, run_dir: str, timeout: float = 10.0) -> None:
        super().__init__(bridge, run_dir, timeout)
        self._encoded: dict[str, bytes] = {}  # flow text -> its FLOW_MOD (xid 0)

    def encoded(self, flow: Flow) -> bool:
        """Whether ``flow`` was encoded before (costs nothing to send again)."""
        return flow.text() in self._encoded

    def encode(self, deletes: Iterable[Cookie], adds: Iterable[Flow]) -> list[bytes]:
        """Delete-by-cookie then add flow-mods; raises ``codec.OpenFlowError`` for a flow the
        codec cannot express."""
        msgs = [codec.flow_mod_delete(c) for c in deletes]
        cache = self._encoded
        for f in adds:
            text = f.text()
            msg = cache.get(text)
            if msg is None:
                msg = codec.flow_mod_add(f)
                if len(cache) > CACHE_LIMIT:
                    cache.clear()
                cache[text] = msg
            msgs.append(msg)
        return msgs
