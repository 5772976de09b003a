"""The Node's WireGuard device: which implementation it uses, the device's life, its sync.

* **Which.**  ``wireguard.implementation`` auto: the kernel's WireGuard when the kernel can make
  a ``wireguard`` link (:func:`routesync.wireguard.kernel.kernel_supported`), else the userspace
  one (wireguard-go).  ``kernel`` / ``userspace`` force one.  ``show`` says which.
* **Kernel.**  The link made over rtnetlink; configured through ``wg`` (:mod:`.wgtool`).
* **Userspace.**  ``wireguard-go -f <interface>`` started as a process of its own session (it
  outlives route-sync, as with ``wg-quick``'s ``WG_QUICK_USERSPACE_IMPLEMENTATION``: a restart of
  route-sync leaves the device and its sessions as they are); configured over its UAPI socket
  (:mod:`.uapi`).  When ``runDir`` is not ``/var/run/wireguard`` (the implementation's fixed
  socket directory), it runs in a mount namespace of its own where ``runDir`` is mounted there:
  one host can carry several Nodes' devices (the lab), each with its own socket.
* **Generation.**  The link's ifindex: the device made again (the process was killed and started
  again, someone deleted the link) is a new generation, and the daemon's next pass is full.

The applier reads the device back and applies only the difference (:func:`.plan.change`)."""

from __future__ import annotations

import logging
import math
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Collection

from routesync.config import WG_KERNEL, WG_USERSPACE, WireGuardConfig

from . import kernel, keys
from .model import KERNEL, USERSPACE, WgBackend, WgChange, WgDeviceState, WgPeerState, WgSpec
from .plan import change as plan_change
from .plan import kick as plan_kick
from .plan import rehandshake as plan_rehandshake
from .uapi import Uapi, socket_path

log = logging.getLogger(__name__)

DEFAULT_SOCKET_DIR = "/var/run/wireguard"  # wireguard-go's, fixed at build time
START_TIMEOUT = 10.0  # s for a started wireguard-go's socket to answer
WAIT_TIMEOUT = 2.0  # s for another process's device, in one pass (the pass is retried)


class DeviceError(RuntimeError):
    """The device cannot be made (the message says what was tried)."""


def choose(config: WireGuardConfig, netns: str | None = None) -> str:
    """KERNEL | USERSPACE for this Node (``implementation``; auto probes the kernel once)."""
    if config.implementation == WG_KERNEL:
        return KERNEL
    if config.implementation == WG_USERSPACE:
        return USERSPACE
    return KERNEL if kernel.kernel_supported(netns) else USERSPACE


def make_userspace_dirs(config: WireGuardConfig) -> None:
    """The directories :func:`userspace_argv`'s command needs: the UAPI sockets' and the fixed one
    it is bind-mounted on."""
    os.makedirs(config.run_dir, mode=0o700, exist_ok=True)
    os.makedirs(DEFAULT_SOCKET_DIR, mode=0o700, exist_ok=True)


def userspace_argv(config: WireGuardConfig) -> list[str]:
    """The command that starts the userspace device (pure: tests read it).  It is started in a
    session of its own (route-sync's exit or restart, and signals to its process group, leave it
    running)."""
    wg = [*shlex.split(config.userspace_command), "-f", config.interface]
    if os.path.normpath(config.run_dir) == DEFAULT_SOCKET_DIR:
        return wg
    script = (f"mount --bind {shlex.quote(config.run_dir)} {DEFAULT_SOCKET_DIR} && exec "
              + " ".join(shlex.quote(a) for a in wg))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


class WireGuardDevice:
    """One Node's device.  ``link_index(name)``: the link's ifindex or None (the route applier's
    netlink, in the Node's namespace)."""

    def __init__(self, config: WireGuardConfig, link_index: Callable[[str], int | None], log_dir: str,
                 netns: str | None = None) -> None:
        self.config = config
        self.netns = netns
        self.log_dir = log_dir
        self._link_index = link_index
        self.implementation = choose(config, netns)
        self.backend: WgBackend
        if self.implementation == KERNEL:
            from .wgtool import WgTool

            self.backend = WgTool()
        else:
            self.backend = Uapi(config.run_dir)
        self._applied: WgSpec | None = None
        self._applied_for: int | None = None
        self._awaited: list[tuple[float, tuple[str, ...]]] = []  # (when, peers): :meth:`take_awaited`
        self._proc: subprocess.Popen[bytes] | None = None  # the userspace device this process started

    @property
    def pid(self) -> int | None:
        """The userspace device's process, when this object started it."""
        return self._proc.pid if self._proc is not None else None

    def reap(self) -> int | None:
        """The exit status of the userspace device this process started, once it has exited (no
        zombie is left); None while it runs or when none was started."""
        if self._proc is None:
            return None
        code = self._proc.poll()
        if code is not None:
            self._proc = None
        return code

    @property
    def name(self) -> str:
        return self.config.interface

    def generation(self) -> int:
        """The link's ifindex (0: no device)."""
        return self._link_index(self.name) or 0

    def ensure(self) -> bool:
        """The device exists and answers; whether it had to be made."""
        if self.implementation == KERNEL:
            if self._link_index(self.name):
                return False
            kernel.create_link(self.name, self.netns)
            log.info("WireGuard %s: kernel device created", self.name)
            return True
        uapi = self.backend
        assert isinstance(uapi, Uapi)
        if uapi.alive(self.name) and self._link_index(self.name):
            return False
        if not self.config.start_userspace:
            self._wait_for_userspace(uapi)
            return False
        self._start_userspace(uapi)
        return True

    def _wait_for_userspace(self, uapi: Uapi) -> None:
        """``startUserspace: false``: the device another process runs (the openvswitch container's
        supervisor) is waited for, briefly; a pass that finds none fails and is retried."""
        deadline = time.monotonic() + WAIT_TIMEOUT
        while not (uapi.alive(self.name) and self._link_index(self.name)):
            if time.monotonic() > deadline:
                raise DeviceError(f"WireGuard {self.name}: no userspace device answers at "
                                  f"{socket_path(self.config.run_dir, self.name)} (wireguard.startUserspace is "
                                  f"false: Ferry's openvswitch container runs it)")
            time.sleep(0.01)  # polling the socket the other process makes: the event itself

    def _start_userspace(self, uapi: Uapi) -> None:
        cfg = self.config
        make_userspace_dirs(cfg)
        sock = socket_path(cfg.run_dir, cfg.interface)
        if os.path.exists(sock) and not uapi.alive(cfg.interface):
            os.unlink(sock)  # a killed implementation's socket file
        os.makedirs(self.log_dir, exist_ok=True)
        logfile = os.path.join(self.log_dir, f"{cfg.interface}.log")
        argv = userspace_argv(cfg)
        if self.netns is not None:  # the appliers' namespace (tests; route-sync runs inside its own)
            argv = ["ip", "netns", "exec", self.netns, *argv]
        env = dict(os.environ, LOG_LEVEL=os.environ.get("FERRY_WG_LOG_LEVEL", "error"))
        t0 = time.monotonic()
        self.reap()
        with open(logfile, "ab") as out:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                                          start_new_session=True)
        deadline = t0 + START_TIMEOUT
        while not (uapi.alive(cfg.interface) and self._link_index(cfg.interface)):
            code = self._proc.poll()
            if code is not None:
                raise DeviceError(f"WireGuard {cfg.interface}: {' '.join(argv)} exited {code}: {_tail(logfile)}")
            if time.monotonic() > deadline:
                raise DeviceError(f"WireGuard {cfg.interface}: {cfg.userspace_command} started but its socket "
                                  f"{sock} did not answer within {START_TIMEOUT:.0f} s (see {logfile})")
            time.sleep(0.005)  # polling the socket the started process creates: the event itself
        log.info("WireGuard %s: userspace device started (%s) in %.0f ms", cfg.interface, cfg.userspace_command,
                 (time.monotonic() - t0) * 1e3)

    def read(self) -> WgDeviceState | None:
        try:
            return self.backend.read(self.name)
        except LookupError:
            return None

    def sync(self, spec: WgSpec, full: bool = True) -> WgChange:
        """The device to ``spec.device``: read back (full, a new device generation) or diffed
        against the last spec applied; the difference applied in one transaction."""
        gen = self.generation()
        at = time.time()
        have = self.read() if (full or self._applied is None or gen != self._applied_for) else None
        if have is None and self._applied is not None and not full and gen == self._applied_for:
            change = plan_change(_as_state(self._applied), spec.device)
        else:
            change = plan_change(have, spec.device)
        if not change.empty:
            self.backend.configure(self.name, change)
        self._applied, self._applied_for = spec, gen
        if change.awaited:
            self._awaited.append((at, change.awaited))
        return change

    def take_awaited(self) -> tuple[tuple[float, tuple[str, ...]], ...]:
        """The first contacts the syncs since the last call left to the peer's handshake
        (:attr:`.model.WgChange.awaited`): (Unix time before the sync, their public keys)."""
        out, self._awaited = tuple(self._awaited), []
        return out

    def kick(self, since: float, among: Collection[str]) -> tuple[str, ...]:
        """Peers of ``among`` with allowed IPs and no handshake since ``since`` (Unix time) kicked
        (:func:`.plan.kick`); their public keys."""
        have = self.read()
        if have is None:
            return ()
        if self.implementation == KERNEL:  # `wg show dump` gives whole seconds
            since = math.floor(since)
        change = plan_kick(have, since, among)
        if change.empty:
            return ()
        self.backend.configure(self.name, change)
        return tuple(p.public_key for p in change.peers)

    def rehandshake(self, since: float, among: Collection[str] | None = None) -> tuple[str, ...]:
        """Peers (of ``among``; None: all) with allowed IPs and no handshake since ``since`` (Unix
        time) made again on the device, so that each sends its handshake at once
        (:func:`.plan.rehandshake` says why); their public keys.  The desired device is unchanged:
        what the last :meth:`sync` applied stays its "before"."""
        have = self.read()
        if have is None:
            return ()
        if self.implementation == KERNEL:  # `wg show dump` gives whole seconds: never a session redone
            since = math.floor(since)
        change = plan_rehandshake(have, since, among)
        if change.empty:
            return ()
        self.backend.configure(self.name, change)
        return tuple(p.public_key for p in change.peers if p.remove)

    def delete(self) -> None:
        """Remove the device (a userspace implementation exits when its TUN link goes)."""
        self._applied = None
        if self._link_index(self.name):
            kernel.delete_link(self.name, self.netns, kernel.KIND if self.implementation == KERNEL else kernel.TUN_KIND)
        self.reap()


def _tail(path: str, limit: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode(errors="replace").strip() or "(no output)"
    except OSError:
        return "(no log)"


def _as_state(spec: WgSpec) -> WgDeviceState:
    """The state a device holds once ``spec`` was applied (an incremental pass's "before")."""
    d = spec.device
    return WgDeviceState(public_key=keys.public_of(d.private_key), listen_port=d.listen_port,
                         peers=tuple(WgPeerState(p.public_key, p.endpoint, p.allowed_ips, p.keepalive)
                                     for p in d.peers), private_key=d.private_key)
