"""One bridge's flow table, as the plugin (and route-sync's Pod-flow replay) uses it: add flows and
delete a cookie's flows over the management socket (:mod:`.session`, one short connection per
call), replace a cookie's flows in one atomic bundle, dump through ``ovs-ofctl`` (:mod:`.ofctl`,
imported only when a command dumps).  Failures raise :class:`OpenFlowError` (``OfctlError``, a
subclass, from ovs-ofctl).
Every flow is encoded natively (:mod:`.codec`); one it cannot express raises, there is no exec
fallback.  Standard library only."""

from __future__ import annotations

from cni.lean.typecheck import TYPE_CHECKING
from cni.ovs.openflow.codec import OpenFlowError, flow_mod_add, flow_mod_delete
from cni.ovs.openflow.session import Session
from cni.pipeline.tables import Cookie

if TYPE_CHECKING:
    from collections.abc import Sequence

    from cni.ovs.openflow.ofctl import DumpedFlow, Ofctl
    from cni.pipeline.tables import Flow

__all__ = ["OpenFlow", "OpenFlowError"]


class OpenFlow:
    """The flow table of one bridge: ``unix:<run_dir>/<bridge>.mgmt``."""

    def __init__(self, bridge: str, run_dir: str, timeout: float = 10.0) -> None:
        self.bridge = bridge
        self.run_dir = run_dir
        self.timeout = timeout
        self._ofctl: Ofctl | None = None

    @property
    def ofctl(self) -> Ofctl:
        """ovs-ofctl, for dumps: imported (with cni.lean.spawn) only by the commands that dump."""
        if self._ofctl is None:
            from cni.ovs.openflow.ofctl import Ofctl

            self._ofctl = Ofctl(self.bridge, self.run_dir, timeout=self.timeout)
        return self._ofctl

    def _transact(self, what: str, messages: list[bytes]) -> None:
        try:
            with Session(self.bridge, self.run_dir, self.timeout) as s:
                s.transact(messages)
        except OpenFlowError as e:
            raise OpenFlowError(f"{what} on {self.bridge}: {e}") from None

    def add_flows(self, flows: Sequence[Flow]) -> None:
        """Add (or overwrite: same table, priority and match) all ``flows``; raises OpenFlowError
        before connecting when one of them cannot be encoded."""
        if flows:
            messages = [flow_mod_add(f, i + 1) for i, f in enumerate(flows)]
            self._transact("add-flows", messages)

    def del_flows(self, cookie: Cookie | str) -> None:
        """Delete every flow whose cookie matches: a Cookie (exactly, over the management socket),
        or ``"V/M"`` text (through ovs-ofctl)."""
        if isinstance(cookie, Cookie):
            self._transact("del-flows", [flow_mod_delete(cookie, 1)])
        else:
            self.ofctl.del_flows(f"cookie={cookie}")

    def dump_flows(self, cookie: Cookie | str | None = None, table: int | None = None) -> list[DumpedFlow]:
        sel = []
        if cookie is not None:
            sel.append(f"cookie={cookie.match() if isinstance(cookie, Cookie) else cookie}")
        if table is not None:
            sel.append(f"table={int(table)}")
        return self.ofctl.dump_flows(",".join(sel))

    def replace_flows(self, cookie: Cookie, flows: Sequence[Flow], atomic: bool = True) -> None:
        """Make ``cookie``'s flows exactly ``flows``: delete + add, in one atomic bundle (packets see
        the old set or the new one, never a mix) unless ``atomic`` is False."""
        messages = [flow_mod_delete(cookie)] + [flow_mod_add(f) for f in flows]
        try:
            with Session(self.bridge, self.run_dir, self.timeout) as s:
                if atomic:
                    s.bundle(messages)
                else:
                    s.transact(messages)
        except OpenFlowError as e:
            raise OpenFlowError(f"replace-flows on {self.bridge}: {e}") from None

