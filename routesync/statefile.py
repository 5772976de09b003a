"""The node state file the plugin reads (``cni.node.nodestate``), as route-sync's loop keeps it:
built from each pass (``planner.node_state``, its rows reused while a peer's plan is the same
object) and written when it differs from what the file holds.

Full passes write the file before returning, unless it already holds the state; so do
incremental ones that change anything but the peers' rows and the cluster's Pod CIDRs (the
policy's namespaces, an MTU, the gateway: an ADD must read them at once).  A pass that changes
only those two lists leaves the state pending: the loop writes it (:meth:`StateFile.flush`) when
no further change came for ``STATE_IDLE`` s, and at the latest ``STATE_MAX_DELAY`` s later.
What of those lists decides a Pod (``podnet.PodInputs``: a cluster prefix outside the ones it
routes, hybrid's routed peers) is written before any Pod is converged to it: the daemon flushes
when the Pods' inputs change.  So a Node added, removed or changed at 5,000 Nodes writes the
~600 KB file once a burst, not once a Node (it was ~2 ms of a change's CPU).

The text is ``NodeState.to_json``'s, but each peer row's part is kept while the row is the same
object (:class:`Encoder`: ``planner.node_state`` reuses an unchanged peer's row), so a write
after one Node changed encodes that Node's row, not every peer's (5,000 peers: the JSON of every
row was ~37 % of a Node change's CPU).  ``tests/routesync/test_node_delta.py`` holds the text
equal to ``to_json``'s."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cni.lean.record import replace as record_replace
from cni.node import nodestate

from . import planner

if TYPE_CHECKING:
    from .config import Config
    from .model import DesiredState, LocalFacts, NodeRecord, PeerPlan

log = logging.getLogger(__name__)

# seconds: an incremental pass's state file write (see the module)
STATE_IDLE, STATE_MAX_DELAY = 0.1, 1.0


# what a state with no peers holds for them: a key (a string's quotes inside a value are escaped)
_NO_PEERS, _NO_CLUSTER = '"peers":[]', '"clusterCIDRs":[]'


class Encoder:
    """``NodeState.to_json`` with each peer row's text kept while the row is the same object."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[nodestate.Peer, str]] = {}  # id(row) -> (row, its text)
        self._given: tuple[list[nodestate.Peer], list[str]] | None = None

    def give(self, rows: list[nodestate.Peer], texts: list[str]) -> None:
        """The texts of ``rows`` (the planner's: ``DesiredState.peer_texts``), for a state whose
        peers are that very list."""
        self._given = (rows, texts)

    def encode(self, state: nodestate.NodeState) -> str:
        given = self._given
        if given is not None and given[0] is state.peers:
            parts = given[1]
        else:
            texts = self._texts
            seen: dict[int, tuple[nodestate.Peer, str]] = {}
            parts = []
            for row in state.peers:
                hit = texts.get(id(row))
                if hit is None or hit[0] is not row:
                    hit = (row, nodestate.json_text(row))
                seen[id(row)] = hit
                parts.append(hit[1])
            self._texts = seen  # the rows are kept alive here, so their ids stay theirs
        # the cluster CIDRs (5,000 at 5,000 peers) go to json as they are: strings need no as_dict
        head = nodestate.json_text(record_replace(state, peers=[], clusterCIDRs=[]))
        head = head.replace(_NO_CLUSTER, '"clusterCIDRs":' + json.dumps(state.clusterCIDRs, separators=(",", ":")), 1)
        return head.replace(_NO_PEERS, '"peers":[' + ",".join(parts) + "]", 1)


def _head(state: nodestate.NodeState) -> nodestate.NodeState:
    """``state`` without its two long lists."""
    return record_replace(state, peers=[], clusterCIDRs=[])


class StateFile:
    def __init__(self, config: Config, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock
        self.last: nodestate.NodeState | None = None  # the latest pass's, written or pending
        self._rows: dict[int, tuple[PeerPlan, nodestate.Peer]] = {}  # planner.node_state's rows
        self._pending: nodestate.NodeState | None = None  # an incremental pass's, written once the loop is idle
        self._pending_since = 0.0
        self._written: nodestate.NodeState | None = None  # what the file holds, when known
        self._encoder = Encoder()

    def state(self, me: NodeRecord, desired: DesiredState, facts: LocalFacts) -> nodestate.NodeState:
        """What the plugin reads of this pass."""
        state = planner.node_state(self.config, me, desired, facts, self._rows)
        if desired.peer_rows is not None and desired.peer_texts is not None:
            self._encoder.give(state.peers, desired.peer_texts)
        return state

    def write(self, state: nodestate.NodeState, full: bool = True) -> bool:
        """``state`` written now, or (incremental, writes not cheap) left pending; whether the
        file changes."""
        if not full and self._rows_only(state):
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
        nodestate.write_text(self._encoder.encode(state), self.config.state_file)
        self._written = state
        log.info("state file %s written (%d peers, mtu %d)", self.config.state_file, len(state.peers), state.mtu)
        return True

    def _rows_only(self, state: nodestate.NodeState) -> bool:
        """Whether ``state`` differs from the latest pass's in the peers' rows and the cluster's
        Pod CIDRs only (what may wait; see the module)."""
        last = self.last
        return last is not None and _head(state) == _head(last)

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
        try:
            nodestate.write_text(self._encoder.encode(state), self.config.state_file)
            self._written = state
        except OSError as e:
            log.error("state file %s not written: %s", self.config.state_file, e)
