"""ExaBGP as route-sync's child, driven through its API.

    speaker = Speaker(cfg, observer)       # cfg.bgp is set
    speaker.start()                        # its thread; ExaBGP starts once the Node's addresses are known
    speaker.want(me.pod_cidrs, facts.uplink_addresses)   # after every reconcile (cheap, never blocks)
    speaker.stop()                         # graceful: withdraw, then ExaBGP ends its sessions (Cease)

One thread owns everything: it renders ExaBGP's configuration (``plan.render_exabgp``), starts
ExaBGP (again, with backoff, when it exits or the configuration changes), accepts the relay's
connection on ``<run dir>/api.sock`` (ExaBGP's API process, ``routesync.bgp.relay``), sends the
announce/withdraw lines that take ExaBGP from what it was sent to what is wanted, and reads the
neighbour state changes back into :class:`routesync.bgp.status.BgpStatus`, the log and the
metrics.  ExaBGP keeps what it was sent across session flaps; a new ExaBGP is sent everything.

ExaBGP gets ``PR_SET_PDEATHSIG`` = SIGKILL (``routesync.bgp.launch``): when route-sync dies (SIGKILL, crash), so does
ExaBGP, the kernel closes its TCP sessions, and the peers drop the routes (at the latest when
their hold timer expires), or keep them as stale for ``bgp.gracefulRestart`` seconds when that
capability was negotiated.  A fault (peer down, refusing, wrong ASN, ExaBGP failing) is a log
line, a status entry and a metric; the thread never raises into route-sync."""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import plan, status
from .relay import ENV as RELAY_ENV

if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger(__name__)

POLL = 0.1  # s: how often the thread looks at wants, ExaBGP and the socket
BACKOFF_MIN, BACKOFF_MAX = 1.0, 30.0  # s between ExaBGP restarts after it exited
NO_SESSION_WARN = 30.0  # s without a session before "no session" is logged (at most; a peer's hold time if shorter)
LOG_MAX = 10 << 20  # bytes of exabgp.log before it is rotated (at ExaBGP's next start)
STOP_GRACE = 5.0  # s ExaBGP gets to send its Cease and exit on stop


def exabgp_argv(conf: str) -> list[str]:
    """ExaBGP from this interpreter, dying with this process (``routesync.bgp.launch``; the
    frozen bundle: route-sync's hidden ``exabgp`` command, which does the same)."""
    parent = str(os.getpid())
    if getattr(sys, "frozen", False):
        return [sys.executable, "exabgp", "--parent", parent, conf]
    here = os.path.dirname(os.path.abspath(__file__))
    return [sys.executable, "-I", "-S", os.path.join(here, "launch.py"), parent, sys.executable, "-m", "exabgp", conf]


def relay_argv() -> list[str]:
    if getattr(sys, "frozen", False):
        return [sys.executable, "bgp-relay"]
    return [sys.executable, "-I", "-S", os.path.join(os.path.dirname(os.path.abspath(__file__)), "relay.py")]


class Speaker:
    def __init__(self, config: Config, observer: Any | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        assert config.bgp is not None
        self.config = config
        self.bgp = config.bgp
        self.observer = observer  # routesync.metrics.Observer (bgp_* methods) or None
        self.clock, self.wall = clock, wall
        self.run_dir = config.bgp_run_dir
        self.conf_path = os.path.join(self.run_dir, "exabgp.conf")
        self.sock_path = os.path.join(self.run_dir, "api.sock")
        self.log_path = os.path.join(self.run_dir, "exabgp.log")
        self.status = status.BgpStatus(local_asn=self.bgp.local_asn, peers=[
            status.PeerStatus(p.address, p.asn) for p in self.bgp.peers])
        self._lock = threading.Lock()
        self._wanted: tuple[tuple[str, ...], tuple[str, ...]] | None = None  # (pod CIDRs, uplink addresses)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._proc_conf: str | None = None
        self._proc_started = 0.0
        self._listener: socket.socket | None = None
        self._conn: socket.socket | None = None
        self._buf = b""
        self._sent: frozenset[plan.Route] = frozenset()
        self._pending: collections.deque[str] = collections.deque()  # commands awaiting ExaBGP's answer
        self._restart_at = 0.0
        self._backoff = BACKOFF_MIN
        self._logged: dict[str, str] = {}  # peer -> the last "no session" reason logged (no repeats)
        self._warned_silent: set[str] = set()  # peers said to have no session since ExaBGP started
        self._problems_logged: tuple[str, ...] = ()

    # -- the daemon's side ------------------------------------------------------------------------
    def start(self) -> Speaker:
        os.makedirs(self.run_dir, exist_ok=True)
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.sock_path)
        os.chmod(self.sock_path, 0o600)
        self._listener.listen(1)
        self._listener.setblocking(False)
        self._write_status()
        self._thread = threading.Thread(target=self._run, name="bgp-speaker", daemon=True)
        self._thread.start()
        return self

    def want(self, pod_cidrs: tuple[str, ...], uplink_addresses: tuple[str, ...]) -> None:
        with self._lock:
            self._wanted = (tuple(pod_cidrs), tuple(uplink_addresses))

    def stop(self, timeout: float = STOP_GRACE + 3) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._step()
                except Exception:  # a bug here must not end BGP for good
                    log.exception("BGP speaker step failed; going on")
                    self._stop.wait(1.0)
        finally:
            self._shutdown()

    def _step(self) -> None:
        with self._lock:
            wanted = self._wanted
        if wanted is None:  # no reconcile yet: the Node's addresses are unknown
            self._stop.wait(POLL)
            return
        try:
            sessions, problems = plan.sessions(self.bgp, wanted[1])
            routes, route_problems = plan.routes(self.bgp, wanted[0], wanted[1])
        except plan.PlanError as e:
            self._problem([str(e)])
            self._stop.wait(1.0)
            return
        self._problem(problems + route_problems)
        st = self.status
        st.router_id = sessions[0].router_id if sessions else st.router_id
        for s in sessions:
            ps = st.peer(s.peer.address)
            if ps is not None:
                ps.local_address = s.local_address
        text = plan.render_exabgp(self.bgp, sessions, relay_argv())
        if self._proc is not None and self._proc_conf != text and self._proc.poll() is None:
            log.info("BGP: ExaBGP's configuration changed (Node addresses or router ID): restarting it")
            self._terminate()
        self._reap()
        if self._proc is None and sessions and self.clock() >= self._restart_at:
            self._spawn(text)
        self._accept()
        if self._conn is not None and routes != self._sent:
            self._send(plan.commands(self._sent, routes))
            self._sent = routes
            st.routes = [f"{r.prefix} via {r.next_hop}" for r in sorted(routes)]
            self._advertised_changed()
            self._write_status()
        self._read(POLL)
        self._silent_peers()

    def _problem(self, problems: list[str]) -> None:
        if tuple(problems) != self._problems_logged:
            for p in problems:
                log.error("BGP: %s", p)
            self._problems_logged = tuple(problems)
            self.status.problems = list(problems)
            self._write_status()

    def _spawn(self, text: str) -> None:
        tmp = self.conf_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it may hold MD5 passwords
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.rename(tmp, self.conf_path)
        try:  # one previous log kept: a peer that keeps failing makes ExaBGP log on every retry
            if os.path.getsize(self.log_path) > LOG_MAX:
                os.replace(self.log_path, self.log_path + ".1")
        except OSError:
            pass
        env = {**os.environ, **plan.exabgp_env(), RELAY_ENV: self.sock_path}
        with open(self.log_path, "ab") as logf:
            self._proc = subprocess.Popen(exabgp_argv(self.conf_path), stdin=subprocess.DEVNULL, stdout=logf,
                                          stderr=logf, env=env, close_fds=True, start_new_session=True)
        self._proc_conf, self._proc_started = text, self.clock()
        self._sent = frozenset()
        self._warned_silent.clear()
        self.status.speaker, self.status.speaker_pid = "running", self._proc.pid
        log.info("BGP: ExaBGP started (pid %d, AS %d, peers %s; log %s)", self._proc.pid, self.bgp.local_asn,
                 ", ".join(f"{p.address} AS {p.asn}" for p in self.bgp.peers), self.log_path)
        self._write_status()

    def _reap(self) -> None:
        """ExaBGP exited on its own: log why, forget its session, restart after a backoff."""
        if self._proc is None or self._proc.poll() is None:
            return
        rc = self._proc.returncode
        self._proc = None
        self._drop_conn()
        ran = self.clock() - self._proc_started
        if ran > BACKOFF_MAX:  # it ran a while: this is not a crash loop
            self._backoff = BACKOFF_MIN
        delay, self._backoff = self._backoff, min(self._backoff * 2, BACKOFF_MAX)
        self._restart_at = self.clock() + delay
        log.error("BGP: ExaBGP exited (rc %s) after %.1f s; restarting in %.0f s. Its last lines (%s):\n%s",
                  rc, ran, delay, self.log_path, _tail(self.log_path))
        self.status.speaker, self.status.speaker_pid = "restarting", None
        self.status.speaker_restarts += 1
        if self.observer is not None:
            self.observer.bgp_speaker_restart()
        for ps in self.status.peers:
            self._set_state(ps, "idle")
        self._write_status()

    def _accept(self) -> None:
        if self._listener is None:
            return
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self._drop_conn()
        conn.setblocking(False)
        self._conn, self._buf, self._sent = conn, b"", frozenset()
        self._pending.clear()
        log.debug("BGP: ExaBGP's API process connected")

    def _drop_conn(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn, self._buf = None, b""
        self._pending.clear()

    def _send(self, lines: list[str]) -> None:
        if not lines or self._conn is None:
            return
        data = "".join(f"{line}\n" for line in lines).encode()
        self._conn.setblocking(True)
        try:
            self._conn.settimeout(5.0)
            self._conn.sendall(data)
            self._pending.extend(lines)
            for line in lines:
                log.info("BGP: %s", line)
        except OSError as e:
            log.warning("BGP: cannot send to ExaBGP (%s); it will be sent everything when it is back", e)
            self._drop_conn()
        finally:
            if self._conn is not None:
                self._conn.setblocking(False)

    def _read(self, timeout: float) -> None:
        if self._conn is None:
            self._stop.wait(timeout)
            return
        ready, _, _ = select.select([self._conn], [], [], timeout)
        if not ready:
            return
        try:
            data = self._conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            log.debug("BGP: ExaBGP's API process closed its connection")
            self._drop_conn()
            return
        self._buf += data
        *lines, self._buf = self._buf.split(b"\n")
        for raw in lines:
            self._event(plan.parse_event(raw.decode(errors="replace")))

    def _event(self, ev: plan.PeerEvent | plan.Answer | None) -> None:
        if isinstance(ev, plan.Answer):
            cmd = self._pending.popleft() if self._pending else "?"
            if not ev.ok:
                log.warning("BGP: ExaBGP refused %r", cmd)
            return
        if ev is None:
            return
        ps = self.status.peer(ev.peer)
        if ps is None:
            return
        if ev.state == "up":
            ps.established_count += 1
            self._set_state(ps, "established")
            self._logged.pop(ps.address, None)
            log.info("BGP peer %s (AS %d): session established from %s; advertising %s", ps.address, ps.asn,
                     ps.local_address, ", ".join(ps.advertised) or "nothing")
        elif ev.state == "connected":
            if ps.state != "established":
                self._set_state(ps, "connect")
        elif ev.state == "down":
            was_up = ps.state == "established"
            label, text = plan.classify(ev.reason, was_up)
            self._set_state(ps, "connect")
            self._error(ps, label, text, always=was_up)
        self._write_status()

    def _error(self, ps: status.PeerStatus, label: str, text: str, always: bool) -> None:
        ps.errors += 1
        ps.last_error, ps.last_error_at = text, self.wall()
        if self.observer is not None:
            self.observer.bgp_error(ps.address, label)
        if always or self._logged.get(ps.address) != label:  # a retry failing the same way logs once
            log.warning("BGP peer %s (AS %d): %s%s", ps.address, ps.asn, text,
                        "" if always else "; retrying (logged again when the reason changes)")
            self._logged[ps.address] = label

    def _silent_peers(self) -> None:
        """A peer that never answers gives ExaBGP no event: once per ExaBGP start, a peer without a
        session after its hold time (at most ``NO_SESSION_WARN``) is said to have none."""
        if self._proc is None:
            return
        up_for = self.clock() - self._proc_started
        for ps, peer in zip(self.status.peers, self.bgp.peers, strict=True):
            wait = min(NO_SESSION_WARN, peer.hold_time or NO_SESSION_WARN)
            if ps.address in self._warned_silent or up_for < wait or ps.state == "established":
                continue
            self._warned_silent.add(ps.address)
            if ps.address not in self._logged:  # a failure with a reason was logged already
                self._error(ps, plan.REASON_CONNECT, f"no session after {wait:.0f} s "
                            "(peer down, filtered, or not configured for this Node)", always=False)
                self._write_status()

    def _set_state(self, ps: status.PeerStatus, state: str) -> None:
        if ps.state != state:
            ps.state, ps.since = state, self.wall()
        self._advertised(ps)

    def _advertised(self, ps: status.PeerStatus) -> None:
        ps.advertised = sorted(r.prefix for r in self._sent) if ps.state == "established" else []
        if self.observer is not None:
            fams = {4: 0, 6: 0}
            for p in ps.advertised:
                fams[6 if ":" in p else 4] += 1
            self.observer.bgp_peer(ps.address, ps.state == "established", fams)

    def _advertised_changed(self) -> None:
        for ps in self.status.peers:
            self._advertised(ps)

    def _write_status(self) -> None:
        try:
            status.write(self.status, self.run_dir)
        except OSError as e:
            log.warning("BGP: status file not written in %s: %s", self.run_dir, e)

    # -- stopping -------------------------------------------------------------------------------------
    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        self._drop_conn()
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # ExaBGP sends each peer a Cease NOTIFICATION: they drop its routes now
            try:
                proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._sent = frozenset()

    def _shutdown(self) -> None:
        """Graceful stop: withdraw everything, wait for ExaBGP's answers (bounded), end ExaBGP."""
        if self._conn is not None and self._sent:
            self._send(plan.commands(self._sent, frozenset()))
            deadline = self.clock() + 2.0
            while self._pending and self._conn is not None and self.clock() < deadline:
                self._read(0.05)
        self._terminate()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            try:
                os.unlink(self.sock_path)
            except FileNotFoundError:
                pass
        self.status.speaker, self.status.speaker_pid = "stopped", None
        for ps in self.status.peers:
            self._set_state(ps, "idle")
        self.status.routes = []
        self._write_status()
        log.info("BGP: stopped (routes withdrawn, sessions closed)")


def _tail(path: str, n: int = 8) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:]).rstrip()
    except OSError:
        return "(no log)"
