"""The per-connection denied log, pure: what a denied connection's packet-in carries, and the
per-Node bound on the lines it makes.

A Pod's isolation drop (``routesync.policy.plan``) sends the first packet of each new connection
it denies up to route-sync (``controller()``, metered by the switch) with :func:`userdata`: the
direction, the Pod and the policies that isolate it.  :class:`DeniedLog` turns a packet-in into
one line

    denied: TCP 10.244.1.5:41234 -> 10.244.2.7:80, ingress to ns/pod, isolated by ns/policy-a, ns/policy-b

once per connection (a retransmitted SYN of a denied connection is ``+new`` again: the same
5-tuple seen within ``REPEAT_SECONDS`` is not logged twice), and at most ``burst`` lines at once
and ``rate`` a second on average (a token bucket); what the bucket refused is counted
(``suppressed``, a Prometheus counter) instead of logged.

A remote Pod's egress isolation, judged on this Node (``plan._remote_isolation``), is one flow
for all such Pods: its userdata names the Pod :data:`REMOTE`, and the line names the Pod and its
policies by the packet's source address (:meth:`DeniedLog.set_remote`, from each plan):

    denied: TCP 10.244.2.9:41234 -> 10.244.1.7:80, egress from ns/client (of another Node,
    judged here), isolated by ns/p

A ClusterNetworkPolicy Deny rule (``routesync.policy.cnp.plan``, with the log on) sends every
packet it drops up, metered like the rest, with :func:`tier_userdata`: the rule, not a Pod (one
conjunction covers many), so the line names the policy, its tier and priority, and the rule:

    denied: TCP 10.244.1.5:41234 -> 10.96.0.1:443, egress, by ClusterNetworkPolicy deny-api
    (Admin tier, priority 10), egress rule 0 "no-api-server"
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cni.ovs.openflow.packetin import Connection

MAGIC = b"F1"  # the version of the userdata below
TIER_MAGIC = b"T1"  # a ClusterNetworkPolicy Deny rule's (:func:`tier_userdata`)
SEP = b"|"
INGRESS, EGRESS = "ingress", "egress"
MAX_USERDATA = 1024  # a controller() action's userdata, at most (cni.pipeline.actions.Controller)
REMOTE = "*"  # the Pod of a remote isolation's userdata: read off the packet's source
REPEAT_SECONDS = 30.0  # a connection seen again within this is the same one (SYN retransmits)
RECENT_MAX = 4096  # connections remembered for that, at most


@dataclass(frozen=True)
class Denial:
    """What a denied connection's packet-in says of the flow that sent it."""

    direction: str
    pod: str  # namespace/name
    policies: tuple[str, ...]  # namespace/name of those that isolate it
    more: int = 0  # policies left out to keep the userdata short


def userdata(direction: str, pod: str, policies: Iterable[str]) -> bytes:
    """``F1|ingress|ns/pod|ns/p1,ns/p2`` (Kubernetes names hold neither ``|`` nor ``,``); past
    :data:`MAX_USERDATA` the last policies give way to ``+N`` (how many were left out)."""
    if direction not in (INGRESS, EGRESS):
        raise ValueError(f"direction: {direction!r} is neither {INGRESS} nor {EGRESS}")
    names = sorted(set(policies))
    head = SEP.join((MAGIC, direction.encode(), pod.encode())) + SEP
    body = b",".join(n.encode() for n in names)
    kept = len(names)
    while len(head) + len(body) > MAX_USERDATA and kept:
        kept -= 1
        body = b",".join(n.encode() for n in names[:kept]) + f"{',' if kept else ''}+{len(names) - kept}".encode()
    if len(head) + len(body) > MAX_USERDATA:
        raise ValueError(f"pod: {pod!r} is too long for a controller() action's userdata")
    return head + body


@dataclass(frozen=True)
class TierDenial:
    """What a ClusterNetworkPolicy Deny rule's packet-in says: the rule that denied it."""

    direction: str
    policy: str  # "Admin/10/name"
    index: int
    rule: str


def tier_userdata(direction: str, policy: str, index: int, rule: str) -> bytes:
    """``T1|egress|Admin/10/deny-api|0|rule-name`` (Kubernetes names hold no ``|``)."""
    if direction not in (INGRESS, EGRESS):
        raise ValueError(f"direction: {direction!r} is neither {INGRESS} nor {EGRESS}")
    out = SEP.join((TIER_MAGIC, direction.encode(), policy.encode(), str(index).encode(), rule.encode()))
    if len(out) > MAX_USERDATA:
        raise ValueError(f"policy: {policy!r} is too long for a controller() action's userdata")
    return out


def parse_tier_userdata(data: bytes) -> TierDenial | None:
    """:func:`tier_userdata` read back; None for anything else."""
    parts = data.split(SEP)
    if len(parts) != 5 or parts[0] != TIER_MAGIC:
        return None
    try:
        direction, policy, index, rule = (p.decode() for p in parts[1:])
    except UnicodeDecodeError:
        return None
    if direction not in (INGRESS, EGRESS) or not policy or not index.isdigit():
        return None
    return TierDenial(direction, policy, int(index), rule)


def tier_line(conn: Connection, d: TierDenial) -> str:
    """The log line of a connection a ClusterNetworkPolicy rule denied."""
    tier, _, rest = d.policy.partition("/")
    priority, _, name = rest.partition("/")
    rule = f' "{d.rule}"' if d.rule else ""
    return (f"denied: {conn.text()}, {d.direction}, by ClusterNetworkPolicy {name} ({tier} tier, priority "
            f"{priority}), {d.direction} rule {d.index}{rule}")


def parse_userdata(data: bytes) -> Denial | None:
    """:func:`userdata` read back; None for userdata that is not Ferry's (another controller action)."""
    parts = data.split(SEP)
    if len(parts) != 4 or parts[0] != MAGIC:
        return None
    try:
        direction, pod, names = (p.decode() for p in parts[1:])
    except UnicodeDecodeError:
        return None
    if direction not in (INGRESS, EGRESS) or not pod:
        return None
    policies, more = [], 0
    for n in names.split(","):
        if n.startswith("+") and n[1:].isdigit():
            more = int(n[1:])
        elif n:
            policies.append(n)
    return Denial(direction, pod, tuple(policies), more)


def resolved(conn: Connection, d: Denial, remote: Mapping[str, tuple[str, tuple[str, ...]]]) -> Denial:
    """A remote isolation's denial (pod :data:`REMOTE`) with the Pod and policies that own the
    packet's source in ``remote``; the others as they are."""
    if d.pod != REMOTE:
        return d
    pod, policies = remote.get(conn.src, (f"a Pod at {conn.src}", ()))
    return Denial(d.direction, pod, policies, d.more)


def line(conn: Connection, d: Denial, remote: bool = False) -> str:
    """The log line of one denied connection; ``remote``: judged for a Pod of another Node."""
    where = f"{d.direction} to {d.pod}" if d.direction == INGRESS else f"{d.direction} from {d.pod}"
    if remote:
        where += " (of another Node, judged here)"
    names = ", ".join(d.policies) + (f" and {d.more} more" if d.more else "")
    return f"denied: {conn.text()}, {where}, isolated by {names or '?'}"


class TokenBucket:
    """``burst`` tokens, refilled at ``rate`` a second: :meth:`take` says whether one was left."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket: rate {rate} must be > 0, burst {burst} >= 1")
        self.rate, self.burst, self.clock = rate, float(burst), clock
        self._tokens, self._at = float(burst), clock()

    def take(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class DeniedLog:
    """Packet-ins (connection + userdata) in, lines out, bounded per Node; counts what it left out.
    Used from the listener's one thread; the counters are read by the metrics collector."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.bucket = TokenBucket(rate, burst, clock)
        self.clock = clock
        self._recent: collections.OrderedDict[tuple, float] = collections.OrderedDict()
        self.logged = 0  # lines made
        self.suppressed = 0  # denied connections the bound kept out of the log
        self.repeats = 0  # packets of a connection already logged (retransmits)
        self.foreign = 0  # packet-ins that were not a denied log's (not Ferry's userdata, not IP)
        self._remote: Mapping[str, tuple[str, tuple[str, ...]]] = {}

    def set_remote(self, sources: Mapping[str, tuple[str, tuple[str, ...]]]) -> None:
        """The remote Pods judged here, by address (``Plan.remote_sources`` of the plan in force);
        the daemon's thread replaces the mapping whole, the listener's only reads it."""
        self._remote = sources

    def offer(self, conn: Connection | None, data: bytes) -> str | None:
        """The line for this packet-in, or None (a repeat, over the bound, or not ours)."""
        d: Denial | TierDenial | None = parse_userdata(data)
        if d is None:
            d = parse_tier_userdata(data)
        if d is None or conn is None:
            self.foreign += 1
            return None
        key = (conn.family, conn.proto, conn.src, conn.dst, conn.sport, conn.dport, d.direction)
        now = self.clock()
        seen = self._recent.get(key)
        if seen is not None and now - seen < REPEAT_SECONDS:
            self.repeats += 1
            return None
        self._recent[key] = now
        self._recent.move_to_end(key)
        while len(self._recent) > RECENT_MAX:
            self._recent.popitem(last=False)
        if not self.bucket.take():
            self.suppressed += 1
            return None
        self.logged += 1
        if isinstance(d, TierDenial):
            return tier_line(conn, d)
        return line(conn, resolved(conn, d, self._remote), remote=d.pod == REMOTE)
