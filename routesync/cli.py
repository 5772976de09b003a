"""``ferry-route-sync``: run | show | teardown | install-cni | ovs."""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import Any

import click

from cni.pipeline.modes import SYSTEM

from .config import DEFAULT_CONFIG_FILE, PEERS_SLICES, Config, ConfigError, load

CONFIG_OPT = click.option("--config", "config_path", default=DEFAULT_CONFIG_FILE, show_default=True,
                          help="route-sync YAML config")


def _load(path: str) -> Config:
    try:
        return load(path)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


def _logging(cfg: Config, verbose: bool) -> None:
    handler: logging.Handler = (logging.FileHandler(cfg.log_file) if cfg.log_file
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


@click.group()
def main() -> None:
    """Ferry's per-Node companion: Node registry, tunnels, host routes, masquerade, MTU."""


@main.command()
@CONFIG_OPT
@click.option("-v", "--verbose", is_flag=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, envvar="FERRY_METRICS_PORT",
              show_default=True, help="serve /metrics, /healthz, /readyz on this port (0: off)")
@click.option("--metrics-host", default="0.0.0.0", envvar="FERRY_METRICS_HOST", show_default=True)
def run(config_path: str, verbose: bool, metrics_port: int, metrics_host: str) -> None:
    """Reconcile this Node until SIGTERM/SIGINT."""
    cfg = _load(config_path)
    _logging(cfg, verbose)
    from .apply import make_appliers
    from .daemon import Daemon
    from .sources import make_source

    observer, server = None, None
    if metrics_port:
        from .monitoring import serve

        observer, server = serve(cfg.state_file, metrics_host, metrics_port)
    source = make_source(cfg)
    appliers = make_appliers(cfg)
    speaker = None
    if cfg.bgp is not None:
        from cni.kernel.netlink import Netlink

        from .bgp import gateway
        from .bgp.speaker import Speaker

        try:
            with Netlink() as nl:
                cfg = gateway.resolve(cfg, nl.routes)  # bgp.peers[].address: defaultGateway
        except ConfigError as e:
            raise click.ClickException(str(e)) from None
        assert cfg.bgp is not None
        logging.getLogger(__name__).info("BGP peers: %s", ", ".join(p.address for p in cfg.bgp.peers))
        speaker = Speaker(cfg, observer).start()
    policy = listener = None
    if cfg.network_policy and cfg.node_source.type == "kubernetes":
        from .policy.watch import PolicySource
        from .sources.kube import api_client

        policy = PolicySource(api_client(cfg.node_source.kubeconfig), on_change=source.wake,
                              peer_slices_for=cfg.node_name if cfg.policy_peers == PEERS_SLICES else None)
        if cfg.denied_log.enabled:
            listener = _denied_listener(cfg, observer)
    daemon = Daemon(cfg, source, appliers, observer=observer, bgp=speaker, policy=policy,
                    remote_sources=None if listener is None else listener.denied.set_remote, settle_heap=True)

    def _stop(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("signal %d: stopping", signum)
        daemon.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    logging.getLogger(__name__).info("route-sync %s: mode %s, source %s", cfg.node_name, cfg.mode,
                                     cfg.node_source.type)
    try:
        daemon.run()
    finally:
        if speaker is not None:  # first: withdraw while the Node still forwards
            speaker.stop()
        source.close()
        if listener is not None:
            listener.close()
        if policy is not None:
            policy.close()
        appliers.close()
        if server is not None:
            server.close()


def _denied_listener(cfg: Config, observer: Any) -> Any:
    """The denied log's listener (``routesync.policy.listener``), started: its thread beside the loop."""
    import time

    from .policy.deniedlog import DeniedLog
    from .policy.listener import DeniedListener

    listener = DeniedListener(cfg.bridge, cfg.ovs_run_dir,
                              DeniedLog(cfg.denied_log.rate, cfg.denied_log.burst, time.monotonic))
    if observer is not None:
        observer.metrics.policy.denied_log = listener
    return listener.start()


@main.command()
@CONFIG_OPT
@click.option("-v", "--verbose", is_flag=True)
def ovs(config_path: str, verbose: bool) -> None:
    """Ferry's openvswitch container: run ovsdb-server and ovs-vswitchd for this Node
    (``ovsDaemons: ferry``) until SIGTERM, or wait on the host's (``ovsDaemons: host``); with
    either, the userspace WireGuard device when route-sync is told not to start it."""
    cfg = _load(config_path)
    from .config import OVS_FERRY
    from .openvswitch.plan import Layout
    from .openvswitch.supervise import Supervisor, SupervisorError, watch_host

    _ovs_logging(os.path.join(cfg.ovs_log_dir, "openvswitch.log"), verbose)
    layout = Layout(run_dir=cfg.ovs_run_dir, database=cfg.ovs_database, log_dir=cfg.ovs_log_dir)
    try:
        if cfg.ovs_daemons != OVS_FERRY:
            sys.exit(watch_host(layout, extra=_supervised_wireguard(cfg)))
        sys.exit(Supervisor(layout, load_module=cfg.datapath_type == SYSTEM,
                            before_stop=lambda: _restore_uplink(cfg), extra=_supervised_wireguard(cfg)).run())
    except SupervisorError as e:
        raise click.ClickException(str(e)) from None


def _supervised_wireguard(cfg: Config) -> list[tuple[str, list[str]]]:
    """The userspace WireGuard device, when this container runs it: encryption on, route-sync told
    not to start it (``wireguard.startUserspace: false``) and no WireGuard in the kernel."""
    if not cfg.encrypted or cfg.wireguard.start_userspace:
        return []
    from .wireguard.device import choose, make_userspace_dirs, userspace_argv
    from .wireguard.model import USERSPACE

    if choose(cfg.wireguard) != USERSPACE:
        return []
    make_userspace_dirs(cfg.wireguard)
    return [("wireguard-go", userspace_argv(cfg.wireguard))]


def _restore_uplink(cfg: Config) -> None:
    """Before Ferry's Open vSwitch stops: the Node's address back on its own link, when route-sync
    had moved the uplink onto the bridge (routesync/apply/uplink.py)."""
    from .apply.uplink import restore_recorded

    if restore_recorded(cfg):
        logging.getLogger(__name__).info("openvswitch: the uplink %s is back off the bridge before "
                                         "Open vSwitch stops", cfg.transport_interface)


def _ovs_logging(path: str, verbose: bool) -> None:
    """The supervisor's log: its file and stderr (the container's log)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for handler in (logging.FileHandler(path), logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


@main.command()
@CONFIG_OPT
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--state-file", default=None, help="read this state file instead of the config's")
@click.argument("what", nargs=-1)
def show(config_path: str, as_json: bool, state_file: str | None, what: tuple[str, ...]) -> None:
    """Per-peer decisions from the node state file; ``show policy NAMESPACE/POD``: the
    NetworkPolicy rules in force for a Pod of this Node, with their counters."""
    from cni.node import nodestate

    from . import show as show_mod

    if what:
        if what[0] != "policy" or len(what) != 2 or "/" not in what[1]:
            raise click.UsageError("show [policy NAMESPACE/POD]")
        _show_policy(_load(config_path), what[1], state_file, as_json)
        return

    cfg: Config | None = None
    if state_file is None:
        cfg = _load(config_path)
    elif os.path.exists(config_path):  # only for its bgp section: a broken config does not stop show
        try:
            cfg = load(config_path)
        except ConfigError:
            cfg = None
    path = state_file or cfg.state_file  # type: ignore[union-attr]
    try:
        state = nodestate.read(path)
    except nodestate.StateError as e:
        raise click.ClickException(str(e)) from None
    bgp = None
    if cfg is not None and cfg.bgp is not None:
        from .bgp import status as bgp_status

        bgp = bgp_status.read(cfg.bgp_run_dir) or bgp_status.BgpStatus(cfg.bgp.local_asn, speaker="not running")
    from . import conflicts

    try:
        found = conflicts.read(path)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    uplink = show_mod.uplink_record(path)
    wg = None
    if cfg is not None and cfg.encrypted:
        from .wireguard import status as wg_status

        wg = wg_status.gather(cfg, path)
    click.echo(show_mod.as_json(state, bgp, found, uplink, wg) if as_json
               else show_mod.as_table(state, bgp, found, uplink, wg), nl=as_json)


def _show_policy(cfg: Config, pod: str, state_file: str | None, as_json: bool) -> None:
    import json

    from cni.ovs.openflow.ofctl import Ofctl, OfctlError

    from .policy import stats

    try:
        doc = stats.read_report(state_file or cfg.state_file)
    except (OSError, ValueError) as e:
        raise click.ClickException(f"no policy report ({e}): is route-sync running with networkPolicy?") from None
    try:
        flows = Ofctl(cfg.bridge, cfg.ovs_run_dir).dump_flows(f"cookie={stats.POLICY_COOKIE}")
    except OfctlError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        rules = [stats.rule_from(r) for r in doc.get("rules", []) if pod in r.get("pods", [])]
        click.echo(json.dumps({"pod": pod, "isolated": doc.get("isolated", {}).get(pod),
                               "policies": doc.get("policiesOf", {}).get(pod, []),
                               "rules": [{"policy": c.rule.policy, "direction": c.rule.direction, "index": c.rule.index,
                                          "port": c.rule.port, "conjId": c.rule.conj_id, "packets": c.packets,
                                          "bytes": c.bytes} for c in stats.rule_counts(rules, flows)]}, indent=2))
    else:
        click.echo(stats.pod_table(pod, doc, flows), nl=False)


@main.command("rotate-key")
@CONFIG_OPT
def rotate_key(config_path: str) -> None:
    """Replace this Node's WireGuard key without losing traffic: a next key is made here; the
    running route-sync announces it and every Node switches to it ``wireguard.rotationLead`` s
    later, at one instant (routesync/wireguard/plan.py)."""
    from .wireguard import keys

    cfg = _load(config_path)
    if not cfg.encrypted:
        raise click.ClickException("trafficEncryptionMode is none: there is no WireGuard key to rotate")
    try:
        made = keys.start_rotation(cfg.wireguard.key_dir)
    except (OSError, keys.InvalidKey) as e:
        raise click.ClickException(f"no key rotation: {e}") from None
    if made:
        click.echo(f"next key made in {cfg.wireguard.key_dir}; route-sync announces it and every Node switches "
                   f"to it {cfg.wireguard.rotation_lead:g} s later")
    else:
        click.echo(f"a rotation is already under way ({keys.path(cfg.wireguard.key_dir, keys.NEXT)} exists)")


@main.command()
@CONFIG_OPT
def teardown(config_path: str) -> None:
    """Undo everything route-sync installed on this Node (incl. the uplink move) and remove the
    state file and this Node's registry record."""
    import os

    cfg = _load(config_path)
    _logging(cfg, False)
    from .apply import make_appliers

    appliers = make_appliers(cfg)
    try:
        appliers.teardown(cfg)
    finally:
        appliers.close()
    try:
        os.unlink(cfg.state_file)
    except FileNotFoundError:
        pass
    if cfg.node_source.type == "registry":
        from .sources.registry import RegistrySource

        RegistrySource(cfg.node_source.registry_dir, cfg.node_name).remove_self()
    click.echo(f"route-sync state removed from {cfg.node_name}")


@main.command("exabgp", hidden=True, context_settings={"ignore_unknown_options": True,
                                                       "allow_extra_args": True})
@click.pass_context
def exabgp_cmd(ctx: click.Context) -> None:
    """ExaBGP itself (the frozen bundle has no Python to run ``-m exabgp`` with): ``--parent PID
    ARGS``, dying with route-sync like ``routesync.bgp.launch`` makes it."""
    from exabgp.application.main import main as exabgp_main

    from .bgp.launch import die_with_parent

    args = list(ctx.args)
    if args[:1] == ["--parent"]:
        die_with_parent(int(args[1]))
        args = args[2:]
    sys.argv = ["exabgp", *args]
    exabgp_main()


@main.command("bgp-relay", hidden=True)
def bgp_relay() -> None:
    """ExaBGP's API process (routesync.bgp.relay), for the frozen bundle."""
    from .bgp.relay import main as relay_main

    sys.exit(relay_main())


def _install_cni() -> None:
    from .install import click_command

    main.add_command(click_command())


_install_cni()
