"""The node state file the plugin reads (``cni.node.nodestate``), as route-sync's loop keeps it:
built from each pass (``planner.node_state``, its rows reused while a peer's plan is the same
object) and written when it differs from what the file holds.

Full passes write the file before returning, unless it already holds the state; so do
incremental ones while a write is cheap (the last took < ``STATE_CHEAP``).  Otherwise an
incremental pass leaves a changed state pending: the loop writes it (:meth:`StateFile.flush`)
when no further change came for ``STATE_IDLE`` s, and at the latest ``STATE_MAX_DELAY`` s later
(the file costs ~55 ms at 1,000 peers, ~300 ms at 5,000; what the plugin reads from it does not
change in such passes, only the per-peer list does)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cni.node import nodestate

from . import planner

if TYPE_CHECKING:
    from .config import Config
    from .model import DesiredState, LocalFacts, NodeRecord, PeerPlan

log = logging.getLogger(__name__)

# seconds: an incremental pass's state file write (see the module)
STATE_CHEAP, STATE_IDLE, STATE_MAX_DELAY = 0.01, 0.1, 1.0


class StateFile:
    def __init__(self, config: Config, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.last: nodestate.NodeState | None = None  # the latest pass's, written or pending
        self._rows: dict[int, tuple[PeerPlan, nodestate.Peer]] = {}  # planner.node_state's rows
        self._pending: nodestate.NodeState | None = None  # an incremental pass's, written once the loop is idle
        self._pending_since = 0.0
        self._written: nodestate.NodeState | None = None  # what the file holds, when known
        self._cost = 0.0  # seconds the last write took

    def state(self, me: NodeRecord, desired: DesiredState, facts: LocalFacts) -> nodestate.NodeState:
        """What the plugin reads of this pass."""
        return planner.node_state(self.config, me, desired, facts, self._rows)

    def write(self, state: nodestate.NodeState, full: bool = True) -> bool:
        """``state`` written now, or (incremental, writes not cheap) left pending; whether the
        file changes."""
        if not full and self._cost >= STATE_CHEAP:
            if state == self.last:
                return False
            if self._pending is None:
                self._pending_since = self.clock()
            self._pending = self.last = state
            return True
        self._pending = None
        self.last = state
        if state == self._written:
            return False
        if self._written is None:  # an earlier run may have written the same
            try:
                if nodestate.read(self.config.state_file) == state:
                    self._written = state
                    return False
            except nodestate.StateError:
                pass
        self._written = None
        t0 = self.clock()
        nodestate.write(state, self.config.state_file)
        self._cost = self.clock() - t0
        self._written = state
        log.info("state file %s written (%d peers, mtu %d)", self.config.state_file, len(state.peers), state.mtu)
        return True

    def flush_at(self) -> float | None:
        """While a state is pending: when the loop must wake for it at the latest (``STATE_IDLE``
        from now, or its ``STATE_MAX_DELAY``); None: nothing pending."""
        if self._pending is None:
            return None
        return min(self.clock() + STATE_IDLE, self._pending_since + STATE_MAX_DELAY)

    def flush(self) -> None:
        """Write the state an incremental pass left pending (errors are logged; the next full
        pass writes the file again)."""
        state, self._pending = self._pending, None
        if state is None or state == self._written:
            return
        self._written = None
        t0 = self.clock()
        try:
            nodestate.write(state, self.config.state_file)
            self._cost = self.clock() - t0
            self._written = state
        except OSError as e:
            log.error("state file %s not written: %s", self.config.state_file, e)
